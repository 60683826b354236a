// Runs one compute node (not a source, not a view) on the device its output lives on.
#pragma once

#include <vector>

#include "splice/core/tensor.h"
#include "splice/ir/graph.h"

namespace splice {

// Scalars of a node evaluated for this step.
struct NodeScalars {
  std::int64_t value = 0;  // SymValue's value, FlashDecode's k_len, WriteAt's offset
  // On a CUDA session: a [1] device view of the step-scalar slot that holds `value` (i32 for
  // FlashDecode's k_len, i64 for WriteAt's offset, the node's dtype for SymValue). Kernels read
  // it at run time, so a captured graph replays with new values. Undefined on the CPU.
  Tensor device;
};

// `inputs` are the node's input values, `out` its planned output buffer (concrete shape).
// `aux` carries a node-owned device scalar buffer (FlashDecode's k_len [1] int32) when
// `scalars.device` is undefined.
void run_compute_node(const Node& node, const std::vector<Tensor>& inputs, Tensor& out,
                      const NodeScalars& scalars, Tensor& aux);

// WriteAt: state.slice(axis, offset, offset + value.size(axis)) = value, on state's device (a
// CUDA write reads its offset from `scalars.device` when defined).
void run_write_at(const Node& node, Tensor& state, const Tensor& value, const NodeScalars& scalars);

}  // namespace splice
