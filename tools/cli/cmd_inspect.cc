// splice inspect: builds a demo decode graph of attention layers (or a model's graph), prints it
// before and after the optimizer, and prints every decision (offered / declined and why, max
// error, timings per bucket, winner). --dot FILE writes Graphviz of the optimized graph; --batch B
// builds the graph of B sequences a step.
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli_util.h"
#include "commands.h"
#include "splice/core/error.h"
#include "splice/model/demo.h"
#include "splice/model/loader.h"
#include "splice/tune/optimize.h"

namespace splice::cli {

Runner add_inspect(CLI::App& app) {
  auto o = std::make_shared<DemoAttentionOptions>();
  auto device = std::make_shared<std::string>("cpu");
  auto dot = std::make_shared<std::string>();
  auto cache = std::make_shared<std::string>();
  auto dtype = std::make_shared<std::string>("f32");
  auto json = std::make_shared<bool>(false);
  auto no_select = std::make_shared<bool>(false);
  auto softcap = std::make_shared<float>(0.0f);
  auto window = std::make_shared<std::int64_t>(-1);
  o->capacity = 1024;
  app.add_option("--layers", o->num_layers, "attention layers in the demo graph")
      ->capture_default_str()
      ->check(CLI::Range(0, 1024));
  app.add_option("--heads", o->num_qo_heads, "query heads")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  app.add_option("--kv-heads", o->num_kv_heads, "key/value heads (GQA)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  app.add_option("--head-dim", o->head_dim, "head dimension")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  app.add_option("--batch", o->batch, "sequences a step (the demo graph's and the model's)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 16));
  app.add_option("--capacity", o->capacity, "KV capacity (k_len upper bound)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--dtype", *dtype, "f32, bf16 or f16")
      ->capture_default_str()
      ->check(CLI::IsMember({"f32", "bf16", "f16"}));
  app.add_flag("--alibi", o->alibi, "use ALiBi slopes");
  app.add_option("--softcap", *softcap, "logit softcap (0 = none)")->check(CLI::NonNegativeNumber);
  app.add_option("--window-left", *window, "left window (-1 = none)")
      ->check(CLI::Range(std::int64_t{-1}, std::int64_t{1} << 40));
  app.add_option("--device", *device, "cpu or cuda")->capture_default_str();
  app.add_option("--dot", *dot, "write the optimized graph as Graphviz DOT to FILE");
  app.add_option("--tuning-cache", *cache, "JSON tuning cache to read and update");
  app.add_flag("--no-select", *no_select, "offer arms only; do not verify/time/choose");
  app.add_flag("--json", *json, "machine-readable decisions on stdout");
  auto model = std::make_shared<std::string>();
  app.add_option("--model", *model,
                 "inspect a model (directory or .gguf) instead of the demo graph; "
                 "--capacity is its max_seq_len, --dtype its weight dtype");
  return [=]() {
    DemoAttentionOptions opts = *o;
    opts.dtype = parse_dtype(*dtype, "--dtype");
    if (*softcap > 0) opts.softcap = *softcap;
    if (*window >= 0) opts.window_left = static_cast<std::size_t>(*window);
    DemoAttentionGraph demo;
    std::vector<KdaDecodeSpec> kda_specs;
    std::vector<LayerOpSpec> layer_specs;
    if (model->empty()) {
      demo = build_demo_attention_graph(opts);
    } else {
      const LoadedModel loaded = load_model(*model, opts.dtype);
      BuildOptions build;
      build.batch = opts.batch;
      build.max_seq_len = opts.capacity;
      build.dtype = opts.dtype;
      DecodeModel m = build_decode_model(loaded.config, loaded.weights, build);
      demo.graph = std::move(m.graph);
      demo.specs = std::move(m.attention_specs);
      kda_specs = std::move(m.kda_specs);
      layer_specs = std::move(m.layer_specs);
    }
    const std::string before = print_graph(demo.graph);
    OptimizeOptions opt;
    opt.tune.device = parse_device(*device);
    opt.tune.cache_path = *cache;
    opt.select = !*no_select;
    ProgressBar bar(*json ? nullptr : &std::cerr);
    opt.tune.progress = [&](const std::string& what) { bar.tick(what); };
    DecisionLog log = optimize_graph(demo.graph, demo.specs, opt, kda_specs, layer_specs);
    bar.done();
    if (!dot->empty()) {
      std::ofstream out(*dot);
      if (!out) fail<IoError>("--dot: cannot write '", *dot, "'");
      out << graph_to_dot(demo.graph);
    }
    if (*json) {
      std::cout << decisions_json(log).dump(2) << "\n";
      return 0;
    }
    std::cout << "== graph before the optimizer ==\n" << before << "\n";
    std::cout << "== decisions ==\n" << log.str() << "\n";
    std::cout << "== graph after the optimizer ==\n" << print_graph(demo.graph);
    return 0;
  };
}

}  // namespace splice::cli
