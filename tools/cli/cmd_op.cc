// splice op: run one fused op on tensors read from a safetensors file and write the results, so a
// user can reproduce a mismatch against another library.
//
//   splice op decode-attention --in IN --out OUT [--device cpu|cuda]
//     IN: q [B,Hq,Sq,D], k, v [B,Hkv,cap,D], k_len int32 [B] or [1], optional alibi f32 [Hq];
//     __metadata__ (strings): softmax_scale, causal (true/false), window_left, window_right,
//     softcap (absent = none). OUT: o (q's dtype) and lse (f32 [B,Hq,Sq]).
//   splice op kda-decode --in IN --out OUT [--device cpu|cuda]   (see cmd_op_kda.cc)
// Bad input: a one-line error naming the argument, a non-zero exit, and OUT not written.
#include <cmath>
#include <iostream>

#include "cli_util.h"
#include "commands.h"
#include "splice/core/error.h"
#include "splice/model/safetensors.h"
#include "splice/ops/decode_attention.h"

namespace splice::cli {

int run_kda_op(const std::string& in_path, const std::string& out_path, const std::string& device);

namespace {

double parse_number(const std::map<std::string, std::string>& meta, const std::string& key) {
  const std::string& text = meta.at(key);
  try {
    std::size_t used = 0;
    const double v = std::stod(text, &used);
    if (used != text.size()) throw std::invalid_argument(text);
    return v;
  } catch (const std::exception&) {
    fail<ValueError>("metadata `", key, "` must be a number, got '", text, "'");
  }
}

Tensor required(const SafeTensorsFile& f, const char* name) {
  if (!f.has(name)) fail<ValueError>("input file has no tensor `", name, "`");
  return f.tensor(name);
}

int run_attention(const std::string& in_path, const std::string& out_path,
                  const std::string& device_name) {
  const Device device = parse_device(device_name);
  const SafeTensorsFile in = SafeTensorsFile::open(in_path);
  const auto& meta = in.metadata();
  DecodeAttentionOptions options;
  if (meta.count("softmax_scale"))
    options.softmax_scale = static_cast<float>(parse_number(meta, "softmax_scale"));
  if (meta.count("causal")) {
    const std::string& c = meta.at("causal");
    if (c != "true" && c != "false")
      fail<ValueError>("metadata `causal` must be true or false, got '", c, "'");
    options.causal = c == "true";
  }
  if (meta.count("window_left"))
    options.window_left = static_cast<std::int64_t>(parse_number(meta, "window_left"));
  if (meta.count("window_right"))
    options.window_right = static_cast<std::int64_t>(parse_number(meta, "window_right"));
  if (meta.count("softcap")) options.softcap = static_cast<float>(parse_number(meta, "softcap"));
  auto to_dev = [&](const Tensor& t) {
    return device.is_cpu() ? t.contiguous() : t.to_device(device);
  };
  const Tensor q = to_dev(required(in, "q")), k = to_dev(required(in, "k")),
               v = to_dev(required(in, "v"));
  const Tensor k_len = to_dev(required(in, "k_len"));
  Tensor alibi;
  if (in.has("alibi")) alibi = to_dev(in.tensor("alibi"));
  Tensor lse;
  const Tensor o =
      decode_attention(q, k, v, k_len, alibi.defined() ? &alibi : nullptr, options, {}, &lse);
  auto to_host = [](const Tensor& t) {
    return t.device().is_cpu() ? t : t.to_device(Device::cpu());
  };
  save_safetensors(out_path, {{"o", to_host(o)}, {"lse", to_host(lse)}},
                   {{"op", "decode-attention"}});
  std::cout << "decode-attention: q " << dims_str(q.shape()) << ", k " << dims_str(k.shape())
            << " on " << device.str() << " -> " << out_path << "\n";
  return 0;
}

}  // namespace

Runner add_op(CLI::App& app) {
  app.require_subcommand(1);
  auto in = std::make_shared<std::string>();
  auto out = std::make_shared<std::string>();
  auto device = std::make_shared<std::string>("cpu");
  CLI::App* attention = app.add_subcommand("decode-attention",
                                           "flash-decode attention (spec decode_attention.md §5)");
  CLI::App* kda = app.add_subcommand("kda-decode", "fused KDA decode (spec kda_decode.md)");
  for (CLI::App* sub : {attention, kda}) {
    sub->add_option("--in", *in, "input safetensors file")->required()->check(CLI::ExistingFile);
    sub->add_option("--out", *out, "output safetensors file")->required();
    sub->add_option("--device", *device, "cpu or cuda")->capture_default_str();
  }
  return [=, &app]() {
    (void)app;
    if (attention->parsed()) return run_attention(*in, *out, *device);
    return run_kda_op(*in, *out, *device);
  };
}

}  // namespace splice::cli
