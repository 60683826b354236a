#!/usr/bin/env bash
# dev/clock/probe.sh OUT: does the SM clock of the lent H200 ramp up under a latency-bound decode
# step, and does the step get faster once the clock is high? Logs nvidia-smi clocks every 50 ms
# while it runs the stamps binary on a cold card, then after 2 s of matrix products, then again.
set -u
out=${1:?OUT}
lib=.deps/usr/lib/x86_64-linux-gnu
python3 scripts/peers/smollm2_shaped.py /tmp/m >/dev/null 2>&1
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,pstate,clocks_event_reasons.active \
  --format=csv,noheader -lms 50 >"$out/clk.csv" 2>&1 &
logger=$!
sleep 0.5
echo "== cold"; date +%T.%N
LD_LIBRARY_PATH=$lib .gpubin/step_stamps /tmp/m 64 256 | grep -E "^(flash|row|swiglu|rope|gemv|stamped)" 
echo "== after 2 s of matrix products"; date +%T.%N
python3 - <<'PY'
import time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
t = time.time()
while time.time() - t < 2.0:
    a @ a
torch.cuda.synchronize()
PY
date +%T.%N
LD_LIBRARY_PATH=$lib .gpubin/step_stamps /tmp/m 64 256 | grep -E "^(flash|row|swiglu|rope|gemv|stamped)"
date +%T.%N
sleep 0.3
kill $logger
echo "== clocks (every 50 ms)"
awk -F', ' '$2 != last {print; last = $2}' "$out/clk.csv" | head -80; wc -l <"$out/clk.csv"
