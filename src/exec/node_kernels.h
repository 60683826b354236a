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

// Facts about a node fixed at plan time (computed once per session) that let its kernel relax
// its ordering against the kernels before it.
struct NodeHints {
  // MatMul, MatMulAdd, RmsNormMatMul, SiluMulMatMulAdd, RmsNormMatMulRopeKvAppend,
  // RmsNormMatMulSwiglu: the weight input (weight_input) is a model Param, directly or through
  // Permute / Slice views (never a Reshape, which may copy): no kernel ever writes it, so the CUDA
  // GEMV may stream it before its producers finish (cuda::MatmulOptions::b_constant).
  bool constant_b = false;
  // RopeKvAppend, RmsNormMatMulRopeKvAppend on a CUDA session: the position input
  // (position_input) is a SymValue node (the step-scalar slot itself, written by the session's
  // host copy before the step's first kernel and by nothing inside the step) and cos / sin are
  // constant (Param views): the kernel may read p and its table rows before its producers
  // finish (cuda::rope_kv_append's position_stable).
  bool stable_position = false;
  // FlashDecode on a CUDA session: k_len is the step-scalar slot (as above), and every node of
  // the graph that writes the state under the k or v input is a WriteAt on its sequence axis (2)
  // or a RopeKvAppend whose offset / position is k_len - Sq, symbolically: nothing in the step
  // writes a cache row below k_len - Sq, and earlier steps' graphs have completed, so the kernel
  // may load those rows before its producers finish (cuda::flash_decode's stable_prefix).
  bool stable_kv_prefix = false;
  // RopeKvAppend (or RmsNormMatMulRopeKvAppend) whose output is (through views) the q of a
  // FlashDecode with stable_kv_prefix: a scheduling hint, not a promise. Its kernel triggers its
  // dependents before its own wait, so the attention launches early enough to plan and issue its
  // K/V loads while the q|k|v projection and RoPE still run (run 23: without it those loads sat on
  // the critical path).
  bool trigger_dependents_first = false;
  // KdaDecode on a CUDA session: its slot tables and sequence metadata are Constant or Param
  // nodes (through views: the graph owns them and no kernel writes them; an Input may be a
  // caller's tensor still being written), and the State under its state input is written by no
  // node of the graph but itself and the other arms of a branch it is an arm of (one arm runs
  // per step): the kernel may read the metadata and its source state rows before its producers
  // finish (KdaDecodeOptions::stable_state).
  bool stable_kda_state = false;
};

// The input index of the streamed weight of a product op (MatMul, MatMulAdd: 1; RmsNormMatMul,
// SiluMulMatMulAdd, RmsNormMatMulRopeKvAppend, RmsNormMatMulSwiglu: 2), -1 for every other op.
int weight_input(Op op);

// The input index of the position of an op that reads its tables at a step position
// (RopeKvAppend: 3, RmsNormMatMulRopeKvAppend: 5; cos and sin are the two inputs before it), -1
// for every other op.
int position_input(Op op);

// True when `id` is a Param or a Permute / Slice view chain ending at one (NodeHints::constant_b).
bool is_constant_param_view(const Graph& graph, NodeId id);

// The plan-time hints of node `id` (NodeHints) on a session of `device`.
NodeHints node_hints(const Graph& graph, NodeId id, Device device);

// `inputs` are the node's input values, `out` its planned output buffer (concrete shape).
// `aux` carries a node-owned device scalar buffer (FlashDecode's k_len [1] int32) when
// `scalars.device` is undefined.
void run_compute_node(const Node& node, const std::vector<Tensor>& inputs, Tensor& out,
                      const NodeScalars& scalars, Tensor& aux, const NodeHints& hints = {});

// WriteAt: state.slice(axis, offset, offset + value.size(axis)) = value, on state's device (a
// CUDA write reads its offset from `scalars.device` when defined).
void run_write_at(const Node& node, Tensor& state, const Tensor& value, const NodeScalars& scalars);

}  // namespace splice
