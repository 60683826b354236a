// splice/backend/cpu/kda_decode.h: the CPU backend's fused KDA decode kernel (spec kda_decode.md).
//
// Consumes arguments already validated by the op layer (splice/ops/kda_decode.h), including the
// value contracts, and computes in fp32 with the spec's rounding points (bf16 conv output, bf16
// o before the norm, bf16 final output, state-dtype rounding at checkpoint stores only).
// Work is split over (sequence, head) pairs on the backend thread pool (parallel.h); results do
// not depend on the thread count.
#pragma once

#include "splice/ops/kda_decode.h"

namespace splice::cpu {

// Runs the decode described by `args` (all tensors on the CPU): writes args.output, updates
// args.conv_state and args.state in place.
void kda_decode(const KdaDecodeArgs& args);

}  // namespace splice::cpu
