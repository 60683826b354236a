// Host overhead of a plan-once Session step on the CPU: a decode graph with many nodes and tiny
// tensors, so kernel time is small and the step's own bookkeeping (binding symbols, checking
// inputs, evaluating shapes, choosing arms, dispatching nodes) shows. Reports, per step, the
// total time and the host part (total minus time inside kernel calls).
#include <benchmark/benchmark.h>

#include "splice/core/random.h"
#include "splice/exec/session.h"
#include "splice/model/demo.h"
#include "splice/tune/optimize.h"

namespace splice {
namespace {

void BM_SessionStep(benchmark::State& state) {
  DemoAttentionOptions o;
  o.num_layers = state.range(0);
  o.num_qo_heads = 2;
  o.num_kv_heads = 1;
  o.head_dim = 64;
  o.capacity = 4096;
  DemoAttentionGraph demo = build_demo_attention_graph(o);
  OptimizeOptions opt;
  opt.tune.time_override = [](NodeId, int arm, std::int64_t) { return arm == 1 ? 1.0 : 2.0; };
  optimize_graph(demo.graph, demo.specs, opt);
  const std::size_t nodes = demo.graph.live_nodes().size();
  SessionOptions so;
  so.measure_host_overhead = true;
  Session session(std::move(demo.graph), so);
  Rng rng(1);
  Tensor x = Tensor::empty({1, 1, demo.model_dim}, DType::f32);
  rng.normal(x);
  std::int64_t k = 1;
  double host = 0, total = 0;
  for (auto _ : state) {
    session.step({{"k_len", k}}, {{"x", x}});
    k = k % 64 + 1;
    host += session.last_timing().host_us();
    total += session.last_timing().total_us;
  }
  state.counters["nodes"] = static_cast<double>(nodes);
  state.counters["host_us"] = host / static_cast<double>(state.iterations());
  state.counters["total_us"] = total / static_cast<double>(state.iterations());
  state.counters["host_ns_per_node"] =
      1e3 * host / static_cast<double>(state.iterations()) / static_cast<double>(nodes);
}
BENCHMARK(BM_SessionStep)->Arg(1)->Arg(8)->Arg(30)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace splice

BENCHMARK_MAIN();
