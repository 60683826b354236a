// Verification input generators of the built-in fused kernels.
//
// flash_decode (spec decode_attention.md §4.1): q ~ N(0, 1); the capacity caches k, v hold
// N(0, 1) rows below the verified k_len and NaN at and beyond it, so a kernel that reads past the
// live prefix fails verification; ALiBi slopes stay the model's weights; k_len is bound to the
// verification point.
#include <cmath>
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

}  // namespace

void register_builtin_arm_generators() {
  static std::once_flag once;
  std::call_once(once, [] {
    register_arm_generator("flash_decode", std::make_shared<FlashDecodeGenerator>());
    register_arm_generator("kda_decode", std::make_shared<KdaDecodeGenerator>());
  });
}

}  // namespace splice
