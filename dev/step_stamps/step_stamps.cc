// dev/step_stamps: where one decode step's time goes, kernel by kernel, in the real step (issue
// #7). Built only with -DSPLICE_KERNEL_STAMPS=ON (include/splice/backend/cuda/kernel_stamps.h).
//
//   step_stamps MODEL [STEPS] [MAX_SEQ_LEN] [TUNING_CACHE]
//
// Loads MODEL (a config.json + safetensors directory or a .gguf) in bf16 on CUDA, decodes greedily
// (token 1 first) through 130 warm-up steps (tuning, captures; k_len then in the arm bucket
// [129, 256]), then STEPS (default 64, at most 125) replays with stamps on. A replayed graph's
// kernels keep their grid ids, so the ring is zeroed before each stamped step and read after it;
// a step's stamps, in time order, are the capture's launches in order. The share of launch n is
// the time from its wait return to the next launch's: its post-wait work, completion and
// hand-off (the last launch has none: the step ends with it). Prints, medians over the steps:
//   1. per kernel name: launches per step, us per launch, us per step, share of the step;
//   2. launches 0 .. 2 x (launches per layer) + the last 8 one by one (the first two layers);
//   3. per kernel name: its arrival at the wait after the previous launch's wait return (launch
//      latency plus pre-wait work: above the previous launch's share, the kernel was late), and
//      its own stage marks after its wait return (flash decode: q ready, tile loop, stored);
//   4. the step: the stamped span (first to last stamp) and the host-timed step.
#include <cxxabi.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "splice/backend/cuda/kernel_stamps.h"
#include "splice/backend/cuda/runtime.h"
#include "splice/model/generate.h"
#include "splice/model/loader.h"
#include "splice/model/model.h"

namespace {

using splice::cuda::kernel_stamps::CapturedLaunch;
using splice::cuda::kernel_stamps::Stamp;

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// "void splice::cuda::gemv::(anonymous namespace)::gemv_kernel<__nv_bfloat16, 1, ...>(...)" ->
// "gemv_kernel<__nv_bfloat16, 1, ...>" (the full argument list) and its base name "gemv_kernel".
std::string readable(const std::string& mangled) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> d(
      abi::__cxa_demangle(mangled.c_str(), nullptr, nullptr, &status), std::free);
  std::string s = status == 0 && d ? d.get() : mangled;
  if (!s.empty() && s.back() == ')') {  // the parameter list: back to its matching '('
    std::size_t depth = 0, i = s.size();
    while (i-- > 0) {
      if (s[i] == ')') ++depth;
      if (s[i] == '(' && --depth == 0) break;
    }
    if (i < s.size()) s.erase(i);
  }
  std::size_t depth = 0, cut = 0;
  for (std::size_t i = 0; i < s.size(); ++i) {  // the last "::" outside template arguments
    if (s[i] == '<') ++depth;
    if (s[i] == '>') --depth;
    if (depth == 0 && s.compare(i, 2, "::") == 0) cut = i + 2;
  }
  s.erase(0, cut);
  if (s.rfind("void ", 0) == 0) s.erase(0, 5);
  return s;
}

std::string base_name(const std::string& name) { return name.substr(0, name.find('<')); }

// The instance name without qualifiers (row_kernel<__nv_bfloat16, 1, 6, (Prologue)2>): the
// instances of one kernel differ in their stage marks.
std::string instance_name(std::string name) {
  for (std::size_t colons; (colons = name.find("::")) != std::string::npos;) {
    std::size_t id = colons;
    while (id > 0 && (std::isalnum(static_cast<unsigned char>(name[id - 1])) || name[id - 1] == '_'))
      --id;
    name.erase(id, colons + 2 - id);
  }
  return name;
}

// One launch's stamps in one step, by mark (0 = absent).
struct GridStamps {
  std::uint64_t ns[splice::cuda::kernel_stamps::kMarks] = {};
  std::uint64_t wait() const { return ns[splice::cuda::kernel_stamps::kWaitReturn]; }
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: step_stamps MODEL [STEPS] [MAX_SEQ_LEN] [TUNING_CACHE]\n");
    return 2;
  }
  const std::string model_path = argv[1];
  const int steps = argc > 2 ? std::atoi(argv[2]) : 64;
  const std::int64_t max_seq_len = argc > 3 ? std::atoll(argv[3]) : 256;
  namespace stamps = splice::cuda::kernel_stamps;
  try {
    if (!stamps::available()) {
      std::fprintf(stderr,
                   "step_stamps: this build records no stamps (-DSPLICE_KERNEL_STAMPS=ON)\n");
      return 2;
    }
    splice::LoadedModel loaded = splice::load_model(model_path, splice::DType::bf16);
    splice::BuildOptions build;
    build.max_seq_len = max_seq_len;
    build.dtype = splice::DType::bf16;
    splice::GeneratorOptions go;
    go.device = splice::Device::cuda(0);
    go.optimize.tune.device_name = splice::cuda::device_name(0);
    if (argc > 4) go.optimize.tune.cache_path = argv[4];
    splice::Generator gen(splice::build_decode_model(loaded.config, loaded.weights, build), go);
    // The arms are chosen per k_len bucket (powers of two), and each distinct choice is its own
    // captured graph: warm up into the bucket [129, 256] and stay in it, so every stamped step
    // replays one graph (and any capture it needs happened during the warm-up).
    constexpr int kWarmUp = 130;
    if (kWarmUp + steps + 1 > 256 || kWarmUp + steps + 1 > max_seq_len) {
      std::fprintf(stderr,
                   "step_stamps: %d warm-up + %d + 1 steps must stay within k_len 256 and "
                   "MAX_SEQ_LEN (%lld)\n",
                   kWarmUp, steps, static_cast<long long>(max_seq_len));
      return 2;
    }
    gen.step_greedy(1);
    for (int i = 1; i < kWarmUp; ++i) gen.step_greedy();
    if (!gen.session().last_step_replayed()) {
      std::fprintf(stderr, "step_stamps: the step is not replayed as a CUDA graph:\n%s",
                   gen.session().cuda_graph_status().c_str());
      return 1;
    }
    const std::vector<CapturedLaunch> captured = stamps::captured_launches();
    if (captured.empty()) {
      std::fprintf(stderr, "step_stamps: no launch was captured\n");
      return 1;
    }

    // A replayed graph's kernels keep the grid ids of its instantiation, so every replay writes
    // the same ring slots: the ring is zeroed before each step and read after it. Within a step
    // the stamps are ordered by time (a linear PDL chain: each wait returns after the previous
    // one), which is the captured launch order.
    std::vector<std::vector<GridStamps>> per_step_stamps;
    std::vector<double> wall;
    for (int i = 0; i < steps; ++i) {
      stamps::start(std::size_t{1} << 14);  // 184 launches x 16 marks fit without aliasing
      const auto t0 = std::chrono::steady_clock::now();
      gen.step_greedy();
      wall.push_back(
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
      std::map<std::uint64_t, GridStamps> grids;
      for (const Stamp& s : stamps::collect())
        if (s.mark < stamps::kMarks) grids[s.grid_id].ns[s.mark] = s.ns;
      std::vector<GridStamps> step;
      for (const auto& [id, g] : grids)
        if (g.ns[stamps::kWaitReturn] != 0) step.push_back(g);
      std::sort(step.begin(), step.end(), [](const GridStamps& a, const GridStamps& b) {
        return a.ns[stamps::kWaitReturn] < b.ns[stamps::kWaitReturn];
      });
      per_step_stamps.push_back(std::move(step));
    }
    // The replayed graph's launches: the latest capture whose launch count is the step's stamp
    // count (the replayed choice may have been captured in an earlier bucket).
    std::map<std::uint64_t, std::vector<std::string>> by_capture;
    for (const auto& l : captured) by_capture[l.capture_id].push_back(readable(l.kernel));
    std::uint64_t capture = 0;
    std::vector<std::string> names;
    const std::size_t stamped = per_step_stamps.front().size();
    for (const auto& [id, launches] : by_capture)
      if (launches.size() == stamped) {
        capture = id;
        names = launches;
      }
    const std::size_t per_step = names.size();
    bool uniform = true;
    for (const auto& step : per_step_stamps) uniform = uniform && step.size() == stamped;
    if (per_step < 2 || !uniform) {
      std::fprintf(stderr,
                   "step_stamps: %zu stamps in the first step (uniform over the steps: %s) match "
                   "no capture's launch count (",
                   stamped, uniform ? "yes" : "no");
      for (const auto& [id, launches] : by_capture) std::fprintf(stderr, " %zu", launches.size());
      std::fprintf(stderr, " )\n");
      return 1;
    }
    std::printf("model %s, %zu stamped launches per step (capture %llu), %d steps\n",
                model_path.c_str(), per_step, static_cast<unsigned long long>(capture), steps);

    // share[n][s]: launch n's share of step s, us (n < per_step - 1: the last launch has no
    // successor in its step; its share is in the host-timed step's remainder).
    const std::size_t shared_launches = per_step - 1;
    std::vector<std::vector<double>> share(shared_launches);
    std::vector<double> span;
    // lag[n]: launch n's arrival at its wait after launch n - 1's wait return (n >= 1);
    // stage[n][m]: launch n's mark m after its own wait return (NaN where it has none).
    std::vector<std::vector<double>> lag(per_step);
    std::vector<std::vector<std::vector<double>>> stage(
        per_step, std::vector<std::vector<double>>(stamps::kMarks));
    const auto us = [](std::uint64_t later, std::uint64_t earlier) {
      return (static_cast<double>(later) - static_cast<double>(earlier)) / 1e3;
    };
    for (const auto& step : per_step_stamps) {
      for (std::size_t n = 0; n < shared_launches; ++n)
        share[n].push_back(us(step[n + 1].wait(), step[n].wait()));
      span.push_back(us(step[per_step - 1].wait(), step[0].wait()));
      for (std::size_t n = 0; n < per_step; ++n) {
        if (n > 0 && step[n].ns[stamps::kArrival] != 0)
          lag[n].push_back(us(step[n].ns[stamps::kArrival], step[n - 1].wait()));
        for (unsigned m = stamps::kFirstKernelMark; m < stamps::kMarks; ++m)
          if (step[n].ns[m] != 0) stage[n][m].push_back(us(step[n].ns[m], step[n].wait()));
      }
    }
    std::vector<double> med(shared_launches);
    double total = 0;
    for (std::size_t n = 0; n < shared_launches; ++n) total += med[n] = median(share[n]);

    struct Row {
      int count = 0;
      double us = 0;
    };
    std::map<std::string, Row> by_name;
    for (std::size_t n = 0; n < shared_launches; ++n) {
      Row& r = by_name[base_name(names[n])];
      ++r.count;
      r.us += med[n];
    }
    std::vector<std::pair<std::string, Row>> rows(by_name.begin(), by_name.end());
    std::sort(rows.begin(), rows.end(),
              [](const auto& a, const auto& b) { return a.second.us > b.second.us; });
    std::printf(
        "\n== per kernel (medians over %d steps; a launch's share = its wait return to the "
        "next launch's)\n%-40s %8s %10s %10s %7s\n",
        steps, "kernel", "n/step", "us/launch", "us/step", "share");
    for (const auto& [name, r] : rows)
      std::printf("%-40s %8d %10.2f %10.1f %6.1f%%\n", name.c_str(), r.count, r.us / r.count, r.us,
                  100.0 * r.us / total);
    std::printf("%-40s %8zu %10s %10.1f\n", "sum of medians", shared_launches, "", total);

    // The first two layers one by one (the launch count between two launches of the step's most
    // frequent kernel is the layer's), and the last 8 (final norm, lm_head, argmax).
    std::printf("\n== launches one by one (median us)\n");
    std::size_t shown = std::min<std::size_t>(per_step, 16);
    for (std::size_t n = 0; n < shared_launches; ++n)
      if (n < shown || n + 8 >= shared_launches)
        std::printf("%4zu %8.2f  %s\n", n, med[n], names[n].substr(0, 110).c_str());
      else if (n == shown)
        std::printf("   ...\n");

    // Arrivals and kernel stages, per kernel name (the mean over its launches of the medians).
    std::printf(
        "\n== arrival at the wait after the previous launch's wait return (launch latency and "
        "pre-wait work; above the previous launch's share = the kernel was late), and the "
        "kernel's own stage marks after its wait return (median us; only marks some kernel "
        "records)\n%-56s %8s",
        "kernel", "arrival");
    std::map<std::string, std::vector<std::vector<double>>> by_kernel;  // [mark or 0: arrival]
    std::vector<bool> used(stamps::kMarks, false);
    for (std::size_t n = 1; n < per_step; ++n) {
      auto& row = by_kernel[instance_name(names[n])];
      row.resize(stamps::kMarks);
      if (!lag[n].empty()) row[0].push_back(median(lag[n]));
      for (unsigned m = stamps::kFirstKernelMark; m < stamps::kMarks; ++m)
        if (!stage[n][m].empty()) {
          row[m].push_back(median(stage[n][m]));
          used[m] = true;
        }
    }
    for (unsigned m = stamps::kFirstKernelMark; m < stamps::kMarks; ++m)
      if (used[m]) std::printf(" %*s%u", m < 10 ? 7 : 6, "mark", m);
    std::printf("\n");
    const auto mean = [](const std::vector<double>& v) {
      double sum = 0;
      for (double x : v) sum += x;
      return v.empty() ? 0.0 : sum / static_cast<double>(v.size());
    };
    for (const auto& [name, row] : by_kernel) {
      std::printf("%-56s %8.2f", name.substr(0, 56).c_str(), mean(row[0]));
      for (unsigned m = stamps::kFirstKernelMark; m < stamps::kMarks; ++m)
        if (!used[m])
          continue;
        else if (row[m].empty())
          std::printf(" %8s", "-");
        else
          std::printf(" %8.2f", mean(row[m]));
      std::printf("\n");
    }

    const double wall_med = median(wall);
    std::printf(
        "\n== the step\nstamped span (first stamp to the last) %.1f us, host-timed step_greedy "
        "%.1f us (with the ring's reset and read-back outside it)\n",
        median(span), wall_med);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "step_stamps: %s\n", e.what());
    return 1;
  }
  return 0;
}
