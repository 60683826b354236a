// Node dispatch: maps each compute op to its backend kernel (cpu::* on the CPU, cuda::* on a CUDA
// device) and each fused op to its public op entry point (which validates and picks the device).
// On CUDA every launch goes to cuda::current_stream() (the session's stream), and FlashDecode with
// a device k_len scalar calls the CUDA launcher directly on that stream, so a step can be captured.
#include "exec/node_kernels.h"

#include <algorithm>
#include <optional>
#include <vector>

#include "splice/backend/cpu/primitives.h"
#include "splice/core/error.h"
#include "splice/ops/decode_attention.h"
#include "splice/ops/kda_decode.h"
#include "splice/ops/layer_ops.h"

#ifdef SPLICE_WITH_CUDA
#include "splice/backend/cuda/flash_decode.h"
#include "splice/backend/cuda/primitives.h"
#include "splice/backend/cuda/runtime.h"
#endif

namespace splice {
namespace {

cpu::UnaryKind unary_kind(Op op) {
  switch (op) {
    case Op::Exp:
      return cpu::UnaryKind::exp;
    case Op::Log:
      return cpu::UnaryKind::log;
    case Op::Neg:
      return cpu::UnaryKind::neg;
    case Op::Abs:
      return cpu::UnaryKind::abs;
    case Op::Sqrt:
      return cpu::UnaryKind::sqrt;
    case Op::Rsqrt:
      return cpu::UnaryKind::rsqrt;
    case Op::Reciprocal:
      return cpu::UnaryKind::reciprocal;
    case Op::Sigmoid:
      return cpu::UnaryKind::sigmoid;
    case Op::Silu:
      return cpu::UnaryKind::silu;
    case Op::Softplus:
      return cpu::UnaryKind::softplus;
    default:
      return cpu::UnaryKind::tanh;
  }
}

cpu::BinaryKind binary_kind(Op op) {
  switch (op) {
    case Op::Add:
      return cpu::BinaryKind::add;
    case Op::Sub:
      return cpu::BinaryKind::sub;
    case Op::Mul:
      return cpu::BinaryKind::mul;
    case Op::Div:
      return cpu::BinaryKind::div;
    case Op::Minimum:
      return cpu::BinaryKind::minimum;
    default:
      return cpu::BinaryKind::maximum;
  }
}

cpu::CompareKind compare_kind(Op op) {
  switch (op) {
    case Op::Less:
      return cpu::CompareKind::less;
    case Op::LessEqual:
      return cpu::CompareKind::less_equal;
    case Op::Greater:
      return cpu::CompareKind::greater;
    case Op::GreaterEqual:
      return cpu::CompareKind::greater_equal;
    default:
      return cpu::CompareKind::equal;
  }
}

cpu::ReduceKind reduce_kind(Op op) {
  switch (op) {
    case Op::ReduceSum:
      return cpu::ReduceKind::sum;
    case Op::ReduceMax:
      return cpu::ReduceKind::max;
    default:
      return cpu::ReduceKind::mean;
  }
}

void run_cpu(const Node& n, const std::vector<Tensor>& in, Tensor& out, const NodeScalars& s) {
  if (is_unary(n.op)) return cpu::unary(unary_kind(n.op), in[0], out);
  if (is_binary_arith(n.op)) return cpu::binary(binary_kind(n.op), in[0], in[1], out);
  if (is_compare(n.op)) return cpu::compare(compare_kind(n.op), in[0], in[1], out);
  if (is_reduce(n.op))
    return cpu::reduce(reduce_kind(n.op), in[0], n.attrs.axis, n.attrs.keepdim, out);
  switch (n.op) {
    case Op::SymValue:
      out.set({0}, static_cast<double>(s.value));
      return;
    case Op::Iota:
      return cpu::iota(out, n.attrs.axis);
    case Op::Where:
      return cpu::where(in[0], in[1], in[2], out);
    case Op::Softmax:
      return cpu::softmax(in[0], n.attrs.axis, out);
    case Op::MatMul:
      return cpu::matmul(in[0], in[1], out, n.attrs.transpose_b);
    case Op::Reshape: {  // reached only when the input is not contiguous: copy, then view
      Tensor view = out.reshape(in[0].shape());
      return cpu::cast(in[0], view);
    }
    case Op::Concat:
      return cpu::concat(in, n.attrs.axis, out);
    case Op::Gather:
      return cpu::gather(in[0], in[1], out);
    case Op::Cast:
      return cpu::cast(in[0], out);
    default:
      break;
  }
  SPLICE_INTERNAL_CHECK(false, "run_cpu: op ", op_name(n.op), " is not a compute op");
}

#ifdef SPLICE_WITH_CUDA
// The same kinds as the CPU's (cuda:: re-exports cpu's enums).
void run_cuda(const Node& n, const std::vector<Tensor>& in, Tensor& out, const NodeScalars& s,
              const NodeHints& hints) {
  if (is_unary(n.op)) return cuda::unary(unary_kind(n.op), in[0], out);
  if (is_binary_arith(n.op)) return cuda::binary(binary_kind(n.op), in[0], in[1], out);
  if (is_compare(n.op)) return cuda::compare(compare_kind(n.op), in[0], in[1], out);
  if (is_reduce(n.op))
    return cuda::reduce(reduce_kind(n.op), in[0], n.attrs.axis, n.attrs.keepdim, out);
  switch (n.op) {
    case Op::SymValue:
      if (s.device.defined()) return cuda::cast(s.device, out);
      return cuda::fill(out, static_cast<double>(s.value));
    case Op::Iota:
      return cuda::iota(out, n.attrs.axis);
    case Op::Where:
      return cuda::where(in[0], in[1], in[2], out);
    case Op::Softmax:
      return cuda::softmax(in[0], n.attrs.axis, out);
    case Op::MatMul: {
      cuda::MatmulOptions options;
      options.b_constant = hints.constant_b;
      return cuda::matmul(in[0], in[1], out, n.attrs.transpose_b, options);
    }
    case Op::Reshape: {  // reached only when the input is not contiguous: copy, then view
      Tensor view = out.reshape(in[0].shape());
      return cuda::cast(in[0], view);
    }
    case Op::Concat:
      return cuda::concat(in, n.attrs.axis, out);
    case Op::Gather:
      return cuda::gather(in[0], in[1], out);
    case Op::Cast:
      return cuda::cast(in[0], out);
    default:
      break;
  }
  SPLICE_INTERNAL_CHECK(false, "run_cuda: op ", op_name(n.op), " is not a compute op");
}
#endif

}  // namespace

void run_write_at(const Node& n, Tensor& state, const Tensor& value, const NodeScalars& s) {
  if (state.device().is_cpu()) return cpu::write_at(state, value, n.attrs.axis, s.value);
#ifdef SPLICE_WITH_CUDA
  if (state.device().is_cuda()) {
    if (s.device.defined()) return cuda::write_at(state, value, n.attrs.axis, s.device);
    return cuda::write_at(state, value, n.attrs.axis, s.value);
  }
#endif
  fail<UnsupportedError>("write_at has no kernel on ", state.device().str(), " in this build");
}

int weight_input(Op op) {
  switch (op) {
    case Op::MatMul:
    case Op::MatMulAdd:
      return 1;
    case Op::RmsNormMatMul:
    case Op::SiluMulMatMulAdd:
    case Op::RmsNormMatMulRopeKvAppend:
    case Op::RmsNormMatMulSwiglu:
      return 2;
    default:
      return -1;
  }
}

int position_input(Op op) {
  switch (op) {
    case Op::RopeKvAppend:
      return 3;
    case Op::RmsNormMatMulRopeKvAppend:
      return 5;
    default:
      return -1;
  }
}

bool is_constant_param_view(const Graph& graph, NodeId id) {
  for (;;) {
    const Node& n = graph.node(id);
    if (n.op == Op::Param) return true;
    if (n.op != Op::Permute && n.op != Op::Slice) return false;
    id = n.inputs[0];
  }
}

namespace {

// The State node under `id` through views that keep its coordinates (WriteAt, StateAfter and
// Sequence return their input 0 as it is); nullopt for anything else.
std::optional<NodeId> state_under(const Graph& graph, NodeId id) {
  for (;;) {
    const Node& n = graph.node(id);
    if (n.op == Op::State) return id;
    if (n.op != Op::WriteAt && n.op != Op::StateAfter && n.op != Op::Sequence) return std::nullopt;
    id = n.inputs[0];
  }
}

// The State under `id` through any views (Slice, Permute, Reshape too).
std::optional<NodeId> state_under_any_view(const Graph& graph, NodeId id) {
  for (;;) {
    const Node& n = graph.node(id);
    if (n.op == Op::State) return id;
    if (n.op != Op::WriteAt && n.op != Op::StateAfter && n.op != Op::Sequence &&
        n.op != Op::Slice && n.op != Op::Permute && n.op != Op::Reshape)
      return std::nullopt;
    id = n.inputs[0];
  }
}

// NodeHints::stable_kv_prefix of FlashDecode node `flash`.
bool stable_kv_prefix(const Graph& graph, const Node& flash) {
  const Node& q = graph.node(flash.inputs[0]);
  if (q.shape.size() != 4 || !q.shape[2].is_constant()) return false;
  const SymExpr first_new_row = flash.attrs.flash->k_len.expr() - SymExpr(q.shape[2].constant());
  const std::optional<NodeId> k_state = state_under(graph, flash.inputs[1]);
  const std::optional<NodeId> v_state = state_under(graph, flash.inputs[2]);
  if (!k_state || !v_state) return false;
  auto is_cache = [&](NodeId id) {
    const std::optional<NodeId> s = state_under_any_view(graph, id);
    return s && (*s == *k_state || *s == *v_state);
  };
  for (std::size_t i = 0; i < graph.size(); ++i) {
    const Node& n = graph.node(NodeId{static_cast<std::uint32_t>(i)});
    if (n.erased) continue;
    switch (n.op) {
      case Op::WriteAt:
        if (is_cache(n.inputs[0]) && (!state_under(graph, n.inputs[0]) || n.attrs.axis != 2 ||
                                      !n.attrs.offset.expr().structurally_equal(first_new_row)))
          return false;
        break;
      case Op::RopeKvAppend:
      case Op::RmsNormMatMulRopeKvAppend: {  // the caches are the two inputs after the position
        const int p = position_input(n.op);
        const NodeId k = n.inputs[p + 1], v = n.inputs[p + 2];
        if (is_cache(k) || is_cache(v)) {
          const Node& position = graph.node(n.inputs[p]);
          if (!state_under(graph, k) || !state_under(graph, v) || position.op != Op::SymValue ||
              !position.attrs.value.expr().structurally_equal(first_new_row))
            return false;
        }
        break;
      }
      case Op::KdaDecode:  // writes its conv_state (input 2) and state (input 8) in place
        if (is_cache(n.inputs[2]) || is_cache(n.inputs[8])) return false;
        break;
      default:
        break;
    }
  }
  return true;
}

// The node under `id` through views that do not launch (Reshape, Permute, Slice, Sequence).
NodeId producer_through_views(const Graph& graph, NodeId id) {
  for (;;) {
    const Node& n = graph.node(id);
    if (n.op != Op::Reshape && n.op != Op::Permute && n.op != Op::Slice && n.op != Op::Sequence)
      return id;
    id = n.inputs[0];
  }
}

// NodeHints::trigger_dependents_first of node `id`: a FlashDecode with the stable-prefix promise
// reads it as q.
bool feeds_stable_prefix_attention(const Graph& graph, NodeId id) {
  for (NodeId other : graph.live_nodes()) {
    const Node& n = graph.node(other);
    if (n.op == Op::FlashDecode && producer_through_views(graph, n.inputs[0]) == id &&
        stable_kv_prefix(graph, n))
      return true;
  }
  return false;
}

// The inputs node `n` writes in place (the State under each is the one written).
std::vector<int> in_place_inputs(const Node& n) {
  switch (n.op) {
    case Op::WriteAt:
      return {0};
    case Op::KdaDecode:
      return {2, 8};
    case Op::RopeKvAppend:
    case Op::RmsNormMatMulRopeKvAppend: {
      const int p = position_input(n.op);
      return {p + 1, p + 2};
    }
    default:
      return {};
  }
}

// NodeHints::stable_kda_state of KdaDecode node `id`.
bool stable_kda_state(const Graph& graph, NodeId id) {
  const Node& kda = graph.node(id);
  auto graph_owned = [&](NodeId in) {
    for (;;) {
      const Node& n = graph.node(in);
      if (n.op == Op::Constant || n.op == Op::Param) return true;
      if (n.op != Op::Reshape && n.op != Op::Permute && n.op != Op::Slice) return false;
      in = n.inputs[0];
    }
  };
  // Metadata: state_indices (7); packed: query_start_loc, num_accepted_tokens (11, 12) and
  // t1_state_indices (13).
  for (std::size_t i : {std::size_t{7}, std::size_t{11}, std::size_t{12}, std::size_t{13}})
    if (i < kda.inputs.size() && !graph_owned(kda.inputs[i])) return false;
  const std::optional<NodeId> state = state_under_any_view(graph, kda.inputs[8]);
  if (!state) return false;
  // Nodes that never run in a step that runs `id`: the other arms of each branch holding it.
  std::vector<bool> exclusive(graph.size(), false);
  for (NodeId b : graph.live_nodes()) {
    const Node& branch = graph.node(b);
    if (branch.op != Op::Branch) continue;
    std::vector<std::vector<NodeId>> interiors;
    int holder = -1;
    for (std::size_t arm = 0; arm < branch.inputs.size(); ++arm) {
      interiors.push_back(arm_interior(graph, branch.attrs.branch->diverge, branch.inputs[arm]));
      if (std::find(interiors.back().begin(), interiors.back().end(), id) != interiors.back().end())
        holder = static_cast<int>(arm);
    }
    if (holder < 0) continue;
    for (std::size_t arm = 0; arm < interiors.size(); ++arm)
      if (static_cast<int>(arm) != holder)
        for (NodeId other : interiors[arm]) exclusive[other.index] = true;
  }
  for (NodeId other : graph.live_nodes()) {
    if (other == id || exclusive[other.index]) continue;
    for (int i : in_place_inputs(graph.node(other))) {
      const std::optional<NodeId> written =
          state_under_any_view(graph, graph.node(other).inputs[i]);
      if (written && *written == *state) return false;
    }
  }
  return true;
}

}  // namespace

NodeHints node_hints(const Graph& graph, NodeId id, Device device) {
  const Node& n = graph.node(id);
  NodeHints hints;
  if (const int w = weight_input(n.op); w >= 0)
    hints.constant_b = is_constant_param_view(graph, n.inputs[w]);
  // The step-scalar slot backs a SymValue only on CUDA sessions (Session::run_nodes).
  if (const int p = position_input(n.op); p >= 0 && device.is_cuda())
    hints.stable_position = graph.node(n.inputs[p]).op == Op::SymValue &&
                            is_constant_param_view(graph, n.inputs[p - 2]) &&
                            is_constant_param_view(graph, n.inputs[p - 1]);
  if ((n.op == Op::RopeKvAppend || n.op == Op::RmsNormMatMulRopeKvAppend) && device.is_cuda())
    hints.trigger_dependents_first = feeds_stable_prefix_attention(graph, id);
  // FlashDecode's k_len is the step-scalar slot on CUDA sessions (run_compute_node).
  if (n.op == Op::FlashDecode && device.is_cuda())
    hints.stable_kv_prefix = stable_kv_prefix(graph, n);
  if (n.op == Op::KdaDecode && device.is_cuda())
    hints.stable_kda_state = stable_kda_state(graph, id);
  return hints;
}

void run_compute_node(const Node& n, const std::vector<Tensor>& in, Tensor& out,
                      const NodeScalars& s, Tensor& aux,
                      [[maybe_unused]] const NodeHints& hints) {  // used by the CUDA kernels
  if (n.op == Op::FlashDecode) {
    const FlashDecodeAttrs& f = *n.attrs.flash;
    DecodeAttentionOptions options;
    options.softmax_scale = f.softmax_scale;
    options.causal = f.causal;
    options.window_left = f.window_left;
    options.window_right = f.window_right;
    options.softcap = f.softcap;
#ifdef SPLICE_WITH_CUDA
    if (s.device.defined() && out.device().is_cuda()) {
      // k_len lives in the session's step-scalar buffer: launch on the session's stream.
      cuda::flash_decode(in[0], in[1], in[2], s.device, f.has_alibi ? &in[3] : nullptr, options,
                         out, nullptr, cuda::current_stream(), hints.stable_kv_prefix);
      return;
    }
#endif
    if (!aux.defined()) aux = Tensor::empty({1}, DType::i32, out.device());
    if (aux.device().is_cpu()) {
      aux.data<std::int32_t>()[0] = static_cast<std::int32_t>(s.value);
    } else {
      const auto v = static_cast<std::int32_t>(s.value);
      device_copy(aux.raw_data(), aux.device(), &v, Device::cpu(), sizeof v);
    }
    decode_attention(in[0], in[1], in[2], aux, f.has_alibi ? &in[3] : nullptr, options, out);
    return;
  }
  if (n.op == Op::KdaDecode) {
    // Inputs in the spec's order; conv_state and state are updated in place (they are views of
    // the session's state buffers).
    const KdaAttrs& k = *n.attrs.kda;
    KdaDecodeOptions options;
    options.lower_bound = k.lower_bound;
    options.norm_eps = k.norm_eps;
    options.stable_state = hints.stable_kda_state;
    Tensor conv_state = in[2], state = in[8];
    if (!k.packed) {
      fused_kda_decode(in[0], in[1], conv_state, in[3], in[4], in[5], in[6], in[7], state, in[9],
                       in[10], options, out);
    } else {
      packed_fused_kda_decode(in[0], in[1], conv_state, in[3], in[4], in[5], in[6], in[7], state,
                              in[9], in[10], options, out, in[11], in[12],
                              k.has_t1_state_indices ? &in[13] : nullptr);
    }
    return;
  }
  // The fused layer ops validate against their contract row and pick the device themselves;
  // Rope reads its position from the SymValue node's [1] tensor (device memory on CUDA).
  if (n.op == Op::RmsNorm) return fused_rms_norm(in[0], in[1], n.attrs.eps, out);
  if (n.op == Op::SiluMul) return fused_silu_mul(in[0], in[1], out);
  if (n.op == Op::Rope) return fused_rope(in[0], in[1], in[2], in[3], out);
  if (n.op == Op::RopeKvAppend) {  // the caches (inputs 4, 5) are views of the session's states
    Tensor k_cache = in[4], v_cache = in[5];
    return fused_rope_kv_append(in[0], in[1], in[2], in[3], k_cache, v_cache, out,
                                hints.stable_position, hints.trigger_dependents_first);
  }
  if (n.op == Op::RmsNormMatMulRopeKvAppend) {  // the caches (inputs 6, 7) likewise
    Tensor k_cache = in[6], v_cache = in[7];
    return fused_rms_norm_matmul_rope_kv_append(
        in[0], in[1], n.attrs.eps, in[2], in[3], in[4], in[5], k_cache, v_cache, out,
        hints.constant_b, hints.stable_position, hints.trigger_dependents_first);
  }
  if (n.op == Op::MatMulAdd) return fused_matmul_add(in[0], in[1], in[2], out, hints.constant_b);
  if (n.op == Op::RmsNormMatMul)
    return fused_rms_norm_matmul(in[0], in[1], n.attrs.eps, in[2], out, hints.constant_b);
  if (n.op == Op::RmsNormMatMulSwiglu)
    return fused_rms_norm_matmul_swiglu(in[0], in[1], n.attrs.eps, in[2], out, hints.constant_b);
  if (n.op == Op::SiluMulMatMulAdd)
    return fused_silu_mul_matmul_add(in[0], in[1], in[2], in[3], out, hints.constant_b);
#ifdef SPLICE_WITH_CUDA
  if (out.device().is_cuda()) return run_cuda(n, in, out, s, hints);
#endif
  if (!out.device().is_cpu())
    fail<UnsupportedError>("op ", op_name(n.op), " has no kernel on ", out.device().str(),
                           " in this build");
  run_cpu(n, in, out, s);
}

}  // namespace splice
