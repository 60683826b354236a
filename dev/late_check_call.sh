#!/usr/bin/env bash
# dev/late_check_call.sh: the late-copy tests (a predecessor rewrites what a launch may read before
# its PDL wait, tests/support/late_copy.h) on HEAD's cuda_all_test and on mutants that break the
# pre-wait rules, which must fail them. Carried pack .gpubin/pack/late-check.txz:
#   head/cuda_all_test, <mutant>/cuda_all_test (dev/<mutant>.patch)
# built here: dev/pack_binaries.sh variants / flash-variants with WITH_TESTS=1 for the mutants,
# their benches dropped, HEAD's stripped cuda_all_test added, `tar cJf` (xz: three test binaries
# and .deps fit one call's carry). Then
#   run(command="dev/late_check_call.sh", carry=[".gpubin/pack/late-check.txz", ".deps"])
set -uo pipefail
source "$(dirname "$0")/call_env.sh"
P=/tmp/late-check
rm -rf $P && mkdir -p $P && tar xJf .gpubin/pack/late-check.txz -C $P
tests='KdaCuda.PreWaitReadsOfRewrittenMetadata:FlashDecodeCuda.PlainKernelReadsKLenAfterItsWait:FlashDecodeCuda.StablePrefixReadsTheRowsItsProducerWrites'
for d in $P/*/; do
  b=$(basename $d)
  timeout 150 $d/cuda_all_test --gtest_filter="$tests" >$OUT/$b.txt 2>&1
  echo "== $b: rc $? at $(el) s"
  grep -E '^\[ +(OK|FAILED) \] [A-Za-z]' $OUT/$b.txt | grep -v 'listed below' | sort -u
  # the first failing case of each failed test, and the failure
  grep -E -A3 '^(/.*:[0-9]+: Failure|unknown file: Failure)' $OUT/$b.txt | head -12
done
echo "done at $(el) s"
