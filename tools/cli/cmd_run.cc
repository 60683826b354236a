// splice run / splice bench on the demo attention decoder (demo.h): `run` decodes N steps through
// the planned, optimized graph and prints the decisions and per-step latency; `bench` reports
// steady-state per-step latency p50/p99. (Model loading replaces the demo when it lands.)
#include <algorithm>
#include <chrono>
#include <iostream>

#include "cli_util.h"
#include "commands.h"
#include "splice/core/random.h"
#include "splice/exec/session.h"
#include "splice/model/demo.h"
#include "splice/tune/optimize.h"

namespace splice::cli {

namespace {

struct DemoLoopResult {
  std::vector<double> step_us;
  DecisionLog log;
};

DemoLoopResult demo_loop(std::int64_t steps, const std::string& device_name, const std::string& cache) {
  DemoAttentionOptions o;
  o.num_layers = 4;
  o.capacity = std::max<std::int64_t>(steps, 16);
  DemoAttentionGraph demo = build_demo_attention_graph(o);
  OptimizeOptions opt;
  opt.tune.device = parse_device(device_name);
  opt.tune.device_name = device_key(opt.tune.device);
  opt.tune.cache_path = cache;
  ProgressBar bar(&std::cerr);
  opt.tune.progress = [&](const std::string& what) { bar.tick(what); };
  DemoLoopResult result;
  result.log = optimize_graph(demo.graph, demo.specs, opt);
  bar.done();
  SessionOptions session_options;
  session_options.device = opt.tune.device;
  Session session(std::move(demo.graph), session_options);
  Rng rng(1);
  for (std::int64_t step = 1; step <= steps; ++step) {
    Tensor x = Tensor::empty({1, 1, demo.model_dim}, DType::f32);
    rng.normal(x);
    if (!opt.tune.device.is_cpu()) x = x.to_device(opt.tune.device);
    const auto t0 = std::chrono::steady_clock::now();
    session.step({{"k_len", step}}, {{"x", x}});
    result.step_us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  return result;
}

}  // namespace

Runner add_run(CLI::App& app) {
  auto steps = std::make_shared<std::int64_t>(64);
  auto device = std::make_shared<std::string>("cpu");
  auto cache = std::make_shared<std::string>();
  app.add_option("--steps", *steps, "decode steps")->capture_default_str()->check(CLI::Range(1, 1 << 20));
  app.add_option("--device", *device, "cpu or cuda")->capture_default_str();
  app.add_option("--tuning-cache", *cache, "JSON tuning cache to read and update");
  return [=]() {
    DemoLoopResult r = demo_loop(*steps, *device, *cache);
    std::cout << "decisions:\n" << r.log.str();
    double total = 0;
    for (double us : r.step_us) total += us;
    std::cout << "decoded " << r.step_us.size() << " steps of the demo attention decoder: "
              << total / static_cast<double>(r.step_us.size()) << " us/step, "
              << 1e6 * static_cast<double>(r.step_us.size()) / total << " steps/s\n";
    return 0;
  };
}

Runner add_bench(CLI::App& app) {
  auto steps = std::make_shared<std::int64_t>(256);
  auto device = std::make_shared<std::string>("cpu");
  auto json = std::make_shared<bool>(false);
  app.add_option("--steps", *steps, "decode steps")->capture_default_str()->check(CLI::Range(8, 1 << 20));
  app.add_option("--device", *device, "cpu or cuda")->capture_default_str();
  app.add_flag("--json", *json, "machine-readable output");
  return [=]() {
    DemoLoopResult r = demo_loop(*steps, *device, "");
    std::vector<double> s = r.step_us;
    std::sort(s.begin(), s.end());
    const double p50 = s[s.size() / 2], p99 = s[std::min(s.size() - 1, s.size() * 99 / 100)];
    if (*json) {
      nlohmann::json j{{"steps", s.size()}, {"p50_us", p50}, {"p99_us", p99}, {"tokens_per_s", 1e6 / p50}};
      std::cout << j.dump(2) << "\n";
    } else {
      std::cout << "steps " << s.size() << "  p50 " << p50 << " us  p99 " << p99 << " us  " << 1e6 / p50
                << " tokens/s\n";
    }
    return 0;
  };
}

}  // namespace splice::cli
