#!/usr/bin/env bash
# dev/named_tests_call.sh: GPU tests by name from a carried pack's cuda_all_test, e.g. the tail of
# a shard that dev/refresh_call.sh's `tests` phase cut for time (gtest deals tests round-robin:
# test i of `--gtest_list_tests` goes to shard i % 12).
#   run(command="PACK=.gpubin/pack/refresh1.tgz FILTER='Suite.Test:Suite.Other' dev/named_tests_call.sh",
#       carry=[".gpubin/pack/refresh1.tgz", ".deps"])
# Environment: PACK (required), FILTER (required, a gtest filter), LIMIT (seconds, 480).
# Output: named_tests.txt (gtest's log); the summary prints each test's verdict.
set -uo pipefail
source "$(dirname "$0")/call_env.sh"
P=/tmp/named-tests
rm -rf "$P" && mkdir -p "$P" && tar xzf "${PACK:?set PACK}" -C "$P"
timeout "${LIMIT:-480}" "$P/head/cuda_all_test" --gtest_filter="${FILTER:?set FILTER}" \
  >"$OUT/named_tests.txt" 2>&1
echo "rc=$? after $(el) s"
grep -E '^\[ +(OK|FAILED) +\]|Failure' "$OUT/named_tests.txt"
