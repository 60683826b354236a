#!/usr/bin/env bash
# dev/sass_path.sh UNIT PATTERN: the SASS of one kernel instance, and the size of its code after
# the programmatic-dependent-launch wait (from ACQBULK, griddepcontrol.wait, to each EXIT).
#   UNIT     a file of src/backend/cuda without .cu (gemv, flash_decode, rope_kv_append, ...)
#   PATTERN  a grep -E pattern on the mangled name (e.g. 'bfloat16Li64E' for flash decode's
#            bf16 head_dim 64 instance); the first match is shown
# Needs the cubin dev/sass_size.sh leaves in /tmp/sass_size, and nvdisasm: from the CUDA
# toolkit when it has one, else the nvidia-cuda-nvdisasm wheel from PyPI, unpacked into
# /tmp/nvdisasm (nvcc's image here ships without it). Writes the listing to
# /tmp/sass_size/UNIT.sass and prints the instance's size, its ACQBULK and EXIT offsets and the
# instruction mix after the wait.
set -euo pipefail
unit=${1:?usage: sass_path.sh UNIT PATTERN}
pattern=${2:?usage: sass_path.sh UNIT PATTERN}
cubin=/tmp/sass_size/$unit.cubin
[[ -f $cubin ]] || { echo "no $cubin: run dev/sass_size.sh first" >&2; exit 1; }
nvdisasm=$(command -v nvdisasm || true)
[[ -n $nvdisasm ]] || nvdisasm=$(ls /usr/local/cuda/bin/nvdisasm 2>/dev/null || true)
if [[ -z $nvdisasm ]]; then
  nvdisasm=$(ls /tmp/nvdisasm/nvidia/cu*/bin/nvdisasm 2>/dev/null | head -1 || true)
  if [[ -z $nvdisasm ]]; then
    pip download --quiet --no-deps nvidia-cuda-nvdisasm -d /tmp/nvdisasm >/dev/null
    (cd /tmp/nvdisasm && python3 -m zipfile -e nvidia_cuda_nvdisasm-*.whl .)
    nvdisasm=$(ls /tmp/nvdisasm/nvidia/cu*/bin/nvdisasm | head -1)
    chmod +x "$nvdisasm"
  fi
fi
listing=/tmp/sass_size/$unit.sass
"$nvdisasm" -c "$cubin" >"$listing" 2>/dev/null
python3 - "$listing" "$pattern" <<'EOF'
import collections, re, sys
listing, pattern = sys.argv[1], sys.argv[2]
functions, current = {}, None
for line in open(listing):
    m = re.match(r'^\.text\.(\S+):', line)
    if m:
        current = m.group(1)
        functions[current] = []
    elif current:
        a = re.search(r'/\*([0-9a-f]{4,6})\*/\s*(@!?U?P\w+\s+)?([A-Z0-9_.]+)', line)
        if a:
            functions[current].append((int(a.group(1), 16), a.group(3)))
names = [n for n in functions if re.search(pattern, n)]
if not names:
    sys.exit(f'no instance matches {pattern}')
name = names[0]
code = functions[name]
size = (code[-1][0] + 16) if code else 0
acq = [a for a, op in code if op == 'ACQBULK']
exits = [a for a, op in code if op == 'EXIT']
print(f'{name}\n  {size} bytes; ACQBULK at {[hex(a) for a in acq]}; EXIT at {[hex(a) for a in exits]}')
if acq:
    after = [op for a, op in code if a > acq[0]]
    print(f'  after the wait: {len(after) * 16} bytes up to the last EXIT (every path)')
    print('  instruction mix after the wait:',
          ', '.join(f'{op} {n}' for op, n in collections.Counter(after).most_common(12)))
EOF
