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
# ENV_VARIANTS ("name[@base]:VAR=value[,VAR=value...] ..."): in DIR, a variant directory `name`
# holding copies of FILES from `base` (default BASE) and an `env` file of those variables
# (dev/variant_ab_call.sh, dev/model_batch_call.sh); variant_env DIR/name reads it back into the
# array benv.
make_env_variants() {
  local dir=$1 base=$2 ev f name from
  shift 2
  for ev in ${ENV_VARIANTS:-}; do
    name=${ev%%:*} from=$base
    [[ $name == *@* ]] && from=${name#*@} name=${name%@*}
    mkdir -p "$dir/$name" || return
    for f in "$@"; do cp "$dir/$from/$f" "$dir/$name/" || return; done
    tr ',' '\n' <<<"${ev#*:}" >"$dir/$name/env"
  done
}
variant_env() { benv=(); [[ -f $1/env ]] && mapfile -t benv <"$1/env"; return 0; }
