# Sourced first by the dev/*_call.sh device calls: the repository root as working directory,
# everything printed also to $OUT/summary.txt, the carried .deps libraries on the loader path,
# el() = seconds since the call started.
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
OUT=${OUT:?the device tool sets OUT}
exec > >(tee -a "$OUT/summary.txt") 2>&1
export LD_LIBRARY_PATH="$root/.deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
T0=$(date +%s)
el() { echo $(($(date +%s) - T0)); }
