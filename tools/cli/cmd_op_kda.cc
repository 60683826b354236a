// splice op kda-decode: packed_fused_kda_decode (or fused_kda_decode when the file has no
// query_start_loc and state_indices is [R]) on tensors named as the spec's arguments.
// Tensors are dense row-major in the spec's logical shapes; conv_state [slots, 3C, T+2] is laid
// out as the op needs (each history position one contiguous 3C vector) and written back in the
// logical form. __metadata__: lower_bound (a number or "none"; absent = -5.0), norm_eps.
// OUT holds output, conv_state and state after the call.
#include <iostream>

#include "cli_util.h"
#include "splice/core/error.h"
#include "splice/model/safetensors.h"
#include "splice/ops/kda_decode.h"

namespace splice::cli {

int run_kda_op(const std::string& in_path, const std::string& out_path,
               const std::string& device_name) {
  const Device device = parse_device(device_name);
  const SafeTensorsFile in = SafeTensorsFile::open(in_path);
  auto get = [&](const char* name) {
    if (!in.has(name)) fail<ValueError>("input file has no tensor `", name, "`");
    return in.tensor(name);
  };
  auto to_dev = [&](const Tensor& t) {
    return device.is_cpu() ? t.contiguous() : t.to_device(device);
  };
  KdaDecodeOptions options;
  const auto& meta = in.metadata();
  if (meta.count("lower_bound")) {
    const std::string& v = meta.at("lower_bound");
    if (v == "none") {
      options.lower_bound.reset();
    } else {
      try {
        options.lower_bound = std::stof(v);
      } catch (const std::exception&) {
        fail<ValueError>("metadata `lower_bound` must be a number or 'none', got '", v, "'");
      }
    }
  }
  if (meta.count("norm_eps")) {
    try {
      options.norm_eps = std::stof(meta.at("norm_eps"));
    } catch (const std::exception&) {
      fail<ValueError>("metadata `norm_eps` must be a number, got '", meta.at("norm_eps"), "'");
    }
  }
  // conv_state: logical [slots, 3C, hist] -> physical [slots, hist, 3C] viewed as [slots, 3C,
  // hist].
  const Tensor conv_logical = get("conv_state");
  if (conv_logical.dim() != 3)
    fail<ShapeError>("`conv_state` must be [slots, 3C, T+2], got ", dims_str(conv_logical.shape()));
  const Dims cs = conv_logical.shape();
  Tensor conv_host = Tensor::empty({cs[0], cs[2], cs[1]}, conv_logical.dtype()).permute({0, 2, 1});
  conv_host.copy_from(conv_logical);
  Tensor conv_state =
      device.is_cpu()
          ? conv_host
          : Tensor::empty({cs[0], cs[2], cs[1]}, conv_logical.dtype(), device).permute({0, 2, 1});
  if (!device.is_cpu())
    device_copy(conv_state.raw_data(), device, conv_host.raw_data(), Device::cpu(),
                conv_host.nbytes());
  Tensor state = to_dev(get("state"));
  const Tensor x = to_dev(get("x")), weight = to_dev(get("weight")),
               raw_gate = to_dev(get("raw_gate")), raw_beta = to_dev(get("raw_beta")),
               A_log = to_dev(get("A_log")), dt_bias = to_dev(get("dt_bias")),
               state_indices = to_dev(get("state_indices")),
               output_gate = to_dev(get("output_gate")), norm_weight = to_dev(get("norm_weight"));
  Tensor output;
  if (in.has("query_start_loc")) {
    const Tensor qsl = to_dev(get("query_start_loc")), nat = to_dev(get("num_accepted_tokens"));
    Tensor t1;
    if (in.has("t1_state_indices")) t1 = to_dev(in.tensor("t1_state_indices"));
    output = packed_fused_kda_decode(x, weight, conv_state, raw_gate, raw_beta, A_log, dt_bias,
                                     state_indices, state, output_gate, norm_weight, options, {},
                                     qsl, nat, t1.defined() ? &t1 : nullptr);
  } else {
    output = fused_kda_decode(x, weight, conv_state, raw_gate, raw_beta, A_log, dt_bias,
                              state_indices, state, output_gate, norm_weight, options);
  }
  auto to_host = [](const Tensor& t) {
    return t.device().is_cpu() ? t : t.to_device(Device::cpu());
  };
  Tensor conv_out_physical = Tensor::empty({cs[0], cs[2], cs[1]}, conv_logical.dtype());
  device_copy(conv_out_physical.raw_data(), Device::cpu(), conv_state.raw_data(),
              conv_state.device(), conv_out_physical.nbytes());
  const Tensor conv_out = conv_out_physical.permute({0, 2, 1}).contiguous();
  save_safetensors(
      out_path, {{"output", to_host(output)}, {"conv_state", conv_out}, {"state", to_host(state)}},
      {{"op", "kda-decode"}});
  std::cout << "kda-decode: x " << dims_str(x.shape()) << ", state " << dims_str(state.shape())
            << " on " << device.str() << " -> " << out_path << "\n";
  return 0;
}

}  // namespace splice::cli
