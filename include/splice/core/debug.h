// splice/core/debug.h: the SPLICE_DEBUG environment variable, read by every layer that logs.
//
// Levels (stderr, each including the ones below): 1 the optimizer's arm decisions, the plan
// summary of each named Session (SessionOptions::name: the decode step), and why a CUDA kernel
// fell back to another variant; 2 the IR after each optimizer stage and the plan summary of every
// Session (the tuner's per-arm regions too). Per-node timings come from `splice bench --profile
// N`, not from here.
#pragma once

namespace splice {

// SPLICE_DEBUG's level: 0 when unset, malformed or negative. Read on every call (a test or a
// host may change the variable between sessions); callers read it off the per-token path.
int debug_level();

}  // namespace splice
