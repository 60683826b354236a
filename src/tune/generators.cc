// Verification input generators of the built-in fused kernels.
//
// flash_decode (spec decode_attention.md §4.1): q ~ N(0, 1); the capacity caches k, v hold
// N(0, 1) rows below the verified k_len and NaN at and beyond it, so a kernel that reads past the
// live prefix fails verification; ALiBi slopes stay the model's weights; k_len is bound to the
// verification point.
//
// rms_norm, silu_mul, rope: see LayerOpGenerator below; matmul_add, rms_norm_matmul and
// silu_mul_matmul_add, rms_norm_matmul_swiglu: MatMulAddGenerator; rope_kv_append:
// RopeKvAppendGenerator; rms_norm_matmul_rope_kv_append: QkvRopeGenerator.
#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>

#include "splice/core/error.h"
#include "splice/tune/select.h"

namespace splice {
namespace {

Tensor on_device(Tensor host, const Session& session) {
  return session.device().is_cpu() ? host : host.to_device(session.device());
}

class FlashDecodeGenerator : public ArmInputGenerator {
 public:
  void fill(const Graph& region, const ArmRecipe& recipe, Session& session, std::int64_t selector,
            Rng& rng, SymBindings& symbols, TensorMap& inputs) const override {
    bind_selector(region, recipe, selector, symbols);
    for (NodeId id : region.live_nodes()) {
      const Node& n = region.node(id);
      if (n.op != Op::Input) continue;
      Tensor t = Tensor::empty(upper_bound_shape(n.shape, region.symbols()), n.dtype);
      rng.normal(t);
      if (n.attrs.name == "k" || n.attrs.name == "v") {
        // [B, Hkv, capacity, D]: poison rows [selector, capacity).
        const std::int64_t capacity = t.size(2);
        if (selector < capacity) {
          Tensor tail = t.slice(2, selector, capacity);
          poison_nan(tail);
        }
      }
      inputs[n.attrs.name] = on_device(std::move(t), session);
    }
  }
};

// kda_decode (spec kda_decode.md §6 distributions): x, raw_gate, raw_beta, output_gate ~ N(0, 1);
// conv_state ~ 0.1 N and state ~ 0.01 N over every slot (slot 0 and unused slots included, so a
// write to the wrong slot shows up); conv_state is compared bit for bit, the state within a
// tolerance (fp32 reassociation; bf16 states may differ by one rounding).
class KdaDecodeGenerator : public ArmInputGenerator {
 public:
  std::vector<std::int64_t> verification_points(std::int64_t lo, std::int64_t hi) const override {
    return {lo, hi == lo ? lo : hi};
  }
  void fill(const Graph& region, const ArmRecipe& recipe, Session& session, std::int64_t selector,
            Rng& rng, SymBindings& symbols, TensorMap& inputs) const override {
    bind_selector(region, recipe, selector, symbols);
    for (NodeId id : region.live_nodes()) {
      const Node& n = region.node(id);
      if (n.op == Op::Input) {
        Tensor t = Tensor::empty(upper_bound_shape(n.shape, region.symbols()), n.dtype);
        rng.normal(t);
        inputs[n.attrs.name] = on_device(std::move(t), session);
      } else if (n.op == Op::State) {
        Tensor target = session.state(n.attrs.name);
        Tensor host = Tensor::empty(target.shape(), target.dtype());
        rng.normal(host, 0.0, n.attrs.name == "conv_state" ? 0.1 : 0.01);
        target.copy_from(on_device(std::move(host), session));
      }
    }
  }
  Tolerance tolerance(DType dtype, const std::string& state) const override {
    if (state.empty()) return default_tolerance(dtype);
    return dtype == DType::f32 ? Tolerance{1e-5, 1e-4} : default_tolerance(dtype);
  }
  bool bit_exact_state(const std::string& state) const override { return state == "conv_state"; }
};

// rms_norm, silu_mul, rope (passes/layer_ops.h): every float role ~ N(0, 1), filled in name
// order so both arms' regions see the same values; weights and rope tables stay the model's.
// rope's position role is verified at 0, at the tables' last row and at an interior row (the
// verification points 0, 1, 2 select which) and timed at 0. The regions are tiny: one
// verification point for rms_norm and silu_mul keeps tuning a 30-layer model cheap.
class LayerOpGenerator : public ArmInputGenerator {
 public:
  explicit LayerOpGenerator(bool has_position) : has_position_(has_position) {}
  std::vector<std::int64_t> verification_points(std::int64_t, std::int64_t) const override {
    if (has_position_) return {0, 1, 2};
    return {0};
  }
  void fill(const Graph& region, const ArmRecipe&, Session& session, std::int64_t selector,
            Rng& rng, SymBindings&, TensorMap& inputs) const override {
    std::map<std::string, NodeId> by_name;
    for (NodeId id : region.live_nodes())
      if (region.node(id).op == Op::Input) by_name[region.node(id).attrs.name] = id;
    for (const auto& [name, id] : by_name) {
      const Node& n = region.node(id);
      Tensor t = Tensor::empty(upper_bound_shape(n.shape, region.symbols()), n.dtype);
      if (name == "position") {
        const std::int64_t rows = table_rows(region, id);
        const std::int64_t interior = rows > 2 ? rng.integer(1, rows - 2) : 0;
        const std::int64_t p = selector == 1 ? rows - 1 : selector == 2 ? interior : 0;
        t.data<std::int32_t>()[0] = static_cast<std::int32_t>(p);
      } else {
        rng.normal(t);
      }
      inputs[name] = on_device(std::move(t), session);
    }
  }

 private:
  // Rows of the cos table read at `position` (by the Rope node, or arm 0's Gather).
  static std::int64_t table_rows(const Graph& region, NodeId position) {
    for (NodeId id : region.live_nodes()) {
      const Node& n = region.node(id);
      if (n.op == Op::Rope && n.inputs[3] == position)
        return region.node(n.inputs[1]).shape[0].upper_bound(region.symbols());
      if (n.op == Op::RopeKvAppend && n.inputs[3] == position)  // the tables and the caches
        return std::min(region.node(n.inputs[1]).shape[0].upper_bound(region.symbols()),
                        region.node(n.inputs[4]).shape[2].upper_bound(region.symbols()));
      if (n.op == Op::RmsNormMatMulRopeKvAppend && n.inputs[5] == position)
        return std::min(region.node(n.inputs[3]).shape[0].upper_bound(region.symbols()),
                        region.node(n.inputs[6]).shape[2].upper_bound(region.symbols()));
      if (n.op == Op::Gather && n.inputs[1] == position)
        return region.node(n.inputs[0]).shape[0].upper_bound(region.symbols());
    }
    return 1;
  }
  bool has_position_;
};

// rope_kv_append: LayerOpGenerator's inputs and positions (qkv ~ N(0, 1)); the k and v caches
// ~ N(0, 1) in every row, so a write to a wrong row shows up; v_cache (a copy) compared bit for
// bit, k_cache (RoPE's output) like the output, within the dtype's policy.
class RopeKvAppendGenerator : public LayerOpGenerator {
 public:
  RopeKvAppendGenerator() : LayerOpGenerator(true) {}
  void fill(const Graph& region, const ArmRecipe& recipe, Session& session, std::int64_t selector,
            Rng& rng, SymBindings& symbols, TensorMap& inputs) const override {
    LayerOpGenerator::fill(region, recipe, session, selector, rng, symbols, inputs);
    // Arm 0's write_at offsets are an affine function of one symbol (k_len - 1) that equals the
    // position role in the model: bind that symbol so each offset is this fill's position.
    const Tensor position = inputs.at("position");
    const std::int64_t p =
        (position.device().is_cpu() ? position : position.to_device(Device::cpu()))
            .data<std::int32_t>()[0];
    for (NodeId id : region.live_nodes()) {
      const Node& n = region.node(id);
      if (n.op != Op::WriteAt || n.attrs.offset.is_concrete()) continue;
      std::vector<SymId> ids;
      n.attrs.offset.expr().collect_symbols(ids);
      const SymInfo& info = region.symbols().info(ids.at(0));
      const std::string& name = info.name;
      SymEnv env(region.symbols());
      env.bind(name, info.lo);
      const std::int64_t value = p + (info.lo - n.attrs.offset.eval(env));  // offset = symbol - c
      symbols[name] = value;
      SymEnv check(region.symbols());
      check.bind(name, value);
      if (n.attrs.offset.eval(check) != p)
        fail<GraphError>("rope_kv_append generator: write_at offset ",
                         n.attrs.offset.str(&region.symbols()),
                         " is not the position plus a constant");
    }
    std::map<std::string, NodeId> states;
    for (NodeId id : region.live_nodes())
      if (region.node(id).op == Op::State) states[region.node(id).attrs.name] = id;
    for (const auto& [name, id] : states) {
      Tensor target = session.state(name);
      Tensor host = Tensor::empty(target.shape(), target.dtype());
      rng.normal(host);
      target.copy_from(on_device(std::move(host), session));
    }
  }
  bool bit_exact_state(const std::string& state) const override { return state == "v_cache"; }
};

// matmul_add (y = a @ b^T + c): LayerOpGenerator's inputs (a, c ~ N(0, 1), b the model's
// weight). The fused arm rounds once where its MatMul -> Add region rounds the product first, so
// the arms may differ by half an ulp of |a @ b^T| on top of one ulp of the output, which is not
// bounded by |y| where c cancels the product: the tolerance is the policy default with the atol
// widened 4x in 16-bit dtypes (bf16 {3.2e-2, 1.6e-2}, f16 {4e-3, 4e-3}; f32 unchanged).
// The same generator and tolerance serve the two prologue products: silu_mul_matmul_add (a, b, c
// random, w the model's) is matmul_add after a bitwise-equal activation; rms_norm_matmul (x
// random, norm_weight and w the model's) has no residual, but on CUDA its fused normalization
// sums x^2 in another order than the region's reduce kernel, so a normalized element may round
// one ulp apart before the product: the same widened atol covers a few such flips per row.
// rms_norm_matmul_swiglu is rms_norm_matmul's product followed by silu_mul's exact operations
// (a one-ulp flip of a gate or up element moves the activation by about one ulp): the same.
class MatMulAddGenerator : public LayerOpGenerator {
 public:
  MatMulAddGenerator() : LayerOpGenerator(false) {}
  Tolerance tolerance(DType dtype, const std::string& state) const override {
    constexpr double kAtolWidening = 4.0;
    Tolerance t = default_tolerance(dtype);
    if (state.empty() && (dtype == DType::bf16 || dtype == DType::f16)) t.atol *= kAtolWidening;
    return t;
  }
};

// rms_norm_matmul_rope_kv_append: RopeKvAppendGenerator's inputs, positions and caches (x ~ N(0,
// 1), norm_weight and w the model's). Arm 0 is the collapsed rms_norm_matmul and rope_kv_append
// arms; the fused arm computes the same q|k|v row, but where arm 0 runs the decomposed RmsNorm
// -> MatMul or the shared-memory GEMV prologue the sum of x^2 (and so a normalized element, and
// so a q|k|v element) may round one ulp apart: the output and both caches get
// MatMulAddGenerator's widened tolerance (v_cache too: here it is a product, not a copy).
class QkvRopeGenerator : public RopeKvAppendGenerator {
 public:
  Tolerance tolerance(DType dtype, const std::string&) const override {
    constexpr double kAtolWidening = 4.0;
    Tolerance t = default_tolerance(dtype);
    if (dtype == DType::bf16 || dtype == DType::f16) t.atol *= kAtolWidening;
    return t;
  }
  bool bit_exact_state(const std::string&) const override { return false; }
};

}  // namespace

void register_builtin_arm_generators() {
  static std::once_flag once;
  std::call_once(once, [] {
    register_arm_generator("flash_decode", std::make_shared<FlashDecodeGenerator>());
    register_arm_generator("kda_decode", std::make_shared<KdaDecodeGenerator>());
    register_arm_generator("rms_norm", std::make_shared<LayerOpGenerator>(false));
    register_arm_generator("silu_mul", std::make_shared<LayerOpGenerator>(false));
    register_arm_generator("rope", std::make_shared<LayerOpGenerator>(true));
    register_arm_generator("matmul_add", std::make_shared<MatMulAddGenerator>());
    register_arm_generator("rms_norm_matmul", std::make_shared<MatMulAddGenerator>());
    register_arm_generator("silu_mul_matmul_add", std::make_shared<MatMulAddGenerator>());
    register_arm_generator("rms_norm_matmul_swiglu", std::make_shared<MatMulAddGenerator>());
    register_arm_generator("rope_kv_append", std::make_shared<RopeKvAppendGenerator>());
    register_arm_generator("rms_norm_matmul_rope_kv_append", std::make_shared<QkvRopeGenerator>());
  });
}

}  // namespace splice
