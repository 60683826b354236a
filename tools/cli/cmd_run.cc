// splice run / splice bench: decode with a model through the optimized, planned-once graph.
//
//   splice run [--model DIR|FILE.gguf] [--prompt TEXT | --prompt-ids 1,2,3] [--max-new-tokens N]
//              [--temperature T --top-k K --top-p P --seed S] [--stop ID,...] [--max-seq-len N]
//              [--dtype bf16|f32] [--kda-state-dtype f32|bf16] [--device cpu|cuda]
//              [--tuning-cache FILE] [--host-greedy] [--json]
//   splice bench [same model options] [--steps N] [--batch B] [--profile P] [--host-greedy]
//                [--json]
// Greedy decoding (temperature 0, and every bench step) chooses each token inside the step by
// default: the argmax runs on the device right after the logits (captured into the step's CUDA
// graph) and feeds the next step there, so a token costs one 4-byte read back instead of a token
// upload, a logits download and a host argmax; --host-greedy selects the host path (A/B).
// Without --model, the embedded default model (a small hybrid KDA/attention decoder whose weights
// splice creates deterministically) is written to the cache directory on first use and loaded.
// `bench --batch B` (B > 1) times the decode step of B sequences in lockstep (every row at the
// same position, as a batched decode step runs its KDA layers with N = B): the session alone,
// fixed tokens (the step's work does not depend on their values) and no token chosen (the
// Generator decodes batch 1); tokens/s counts B tokens a step. `--profile P` runs P more steps
// with the session's per-node profile on (Session::set_profile_nodes: eager, each node's device
// time back to back) and prints the nodes by median time, largest first.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>

#include "cli_util.h"
#include "commands.h"
#include "splice/core/error.h"
#include "splice/exec/session.h"
#include "splice/model/default_model.h"
#include "splice/model/generate.h"
#include "splice/model/loader.h"
#include "splice/model/safetensors.h"
#include "splice/tune/optimize.h"
#ifdef SPLICE_WITH_CUDA
#include "splice/backend/cuda/runtime.h"
#endif

namespace splice::cli {
namespace {

struct ModelArgs {
  std::string model;
  std::string device = "cpu";
  std::string dtype = "bf16";
  std::string kda_state_dtype = "f32";
  std::int64_t max_seq_len = 512;
  bool max_seq_len_given = false;  // --max-seq-len was on the command line
  std::string tuning_cache;
  bool no_optimize = false;
  bool host_greedy = false;
};

void add_model_options(CLI::App& app, ModelArgs& m) {
  app.add_option("--model", m.model,
                 "a model directory (config.json + safetensors) or a .gguf file; "
                 "default: the embedded default model");
  app.add_option("--device", m.device, "cpu or cuda")->capture_default_str();
  app.add_option("--dtype", m.dtype, "weights and activations: bf16, f16 or f32")
      ->capture_default_str()
      ->check(CLI::IsMember({"bf16", "f16", "f32"}));
  app.add_option("--kda-state-dtype", m.kda_state_dtype,
                 "KDA layers' recurrent state storage: f32 or bf16 (models without KDA ignore it)")
      ->capture_default_str()
      ->check(CLI::IsMember({"f32", "bf16"}));
  app.add_option_function<std::int64_t>(
         "--max-seq-len",
         [&m](std::int64_t n) {
           m.max_seq_len = n;
           m.max_seq_len_given = true;
         },
         "KV/KDA cache capacity in positions (default " + std::to_string(m.max_seq_len) + ")")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--tuning-cache", m.tuning_cache, "JSON tuning cache to read and update");
  app.add_flag("--no-optimize", m.no_optimize, "run the decomposed (primitive) arms only");
  app.add_flag("--host-greedy", m.host_greedy,
               "choose greedy tokens on the host (logits copied to the host every token) instead "
               "of inside the step");
}

// Which greedy path a generator takes, for the reports.
const char* greedy_path(bool in_step, const std::string& device) {
  if (!in_step) return "host argmax (logits copied to the host every token)";
  return device == "cpu" ? "in-step argmax (cpu)"
                         : "in-step device argmax (4-byte id read back per token)";
}

struct Opened {
  LoadedModel loaded;
  std::unique_ptr<Generator> generator;
};

// The model at --model (or the default one) and its decode graph for `batch` sequences.
DecodeModel load_and_build(const ModelArgs& m, std::int64_t batch, ProgressBar& bar,
                           LoadedModel& loaded) {
  const std::string path = m.model.empty() ? default_model_dir() : m.model;
  const DType dtype = parse_dtype(m.dtype, "--dtype");
  bar.tick("loading " + path);
  loaded = load_model(path, dtype);
  BuildOptions build;
  build.batch = batch;
  build.max_seq_len = m.max_seq_len;
  build.dtype = dtype;
  build.kda_state_dtype = parse_dtype(m.kda_state_dtype, "--kda-state-dtype");
  bar.tick("building the decode graph");
  return build_decode_model(loaded.config, loaded.weights, build);
}

OptimizeOptions optimize_options(const ModelArgs& m, Device device, ProgressBar& bar) {
  OptimizeOptions o;
  o.tune.device = device;
  o.tune.cache_path = m.tuning_cache;
  o.select = !m.no_optimize;
  o.tune.progress = [&bar](const std::string& what) { bar.tick(what); };
  return o;
}

// `sampled`: the run samples on the host (temperature > 0), so no in-step argmax is installed.
Opened open(const ModelArgs& m, bool quiet, bool sampled = false) {
  Opened o;
  ProgressBar bar(quiet ? nullptr : &std::cerr);
  DecodeModel model = load_and_build(m, 1, bar, o.loaded);
  GeneratorOptions go;
  go.device = parse_device(m.device);
  go.optimize = optimize_options(m, go.device, bar);
  go.measure_host_overhead = true;
  go.greedy_in_step = !m.host_greedy && !sampled;
  o.generator = std::make_unique<Generator>(std::move(model), go);
  bar.done();
  return o;
}

// Median and 99th percentile of `v` (sorted here).
std::pair<double, double> p50_p99(std::vector<double>& v) {
  std::sort(v.begin(), v.end());
  return {v[v.size() / 2], v[std::min(v.size() - 1, v.size() * 99 / 100)]};
}

// `steps` timed calls of step(i) after 4 untimed ones (warm-up; on CUDA the step that captures
// the graph), i counting from 0: each call's wall time and the session's host overhead in it.
struct StepTimes {
  std::vector<double> total, host;
};
template <typename Step>
StepTimes time_steps(std::int64_t steps, const Session& session, Step step) {
  StepTimes t;
  for (std::int64_t i = 0; i < steps + 4; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    step(i);
    const double us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    if (i < 4) continue;
    t.total.push_back(us);
    t.host.push_back(session.last_timing().host_us());
  }
  return t;
}

// bench --profile: `steps` more calls of step(i), i counting on from `first`, with the session's
// per-node profile on; each compute node's median time, largest first, and their sum.
struct ProfiledNode {
  NodeId node;
  double us;
};
struct Profile {
  std::vector<ProfiledNode> nodes;
  double sum_us = 0;
};
template <typename Step>
Profile profile_steps(Session& session, std::int64_t first, std::int64_t steps, Step step) {
  std::map<std::size_t, std::vector<double>> times;  // node index -> one time a step
  session.set_profile_nodes(true);
  for (std::int64_t i = first; i < first + steps; ++i) {
    step(i);
    for (const NodeTime& t : session.last_node_times()) times[t.node.index].push_back(t.us);
  }
  session.set_profile_nodes(false);
  Profile profile;
  for (auto& [index, v] : times) {
    std::sort(v.begin(), v.end());
    profile.nodes.push_back({NodeId{static_cast<std::uint32_t>(index)}, v[v.size() / 2]});
    profile.sum_us += profile.nodes.back().us;
  }
  std::sort(profile.nodes.begin(), profile.nodes.end(),
            [](const ProfiledNode& a, const ProfiledNode& b) { return a.us > b.us; });
  return profile;
}

// A node's name in a profile: its label (or %index) and its op.
std::string node_name(const Graph& graph, NodeId id) {
  const Node& n = graph.node(id);
  return (n.label.empty() ? "%" + std::to_string(id.index) : n.label) + " (" + op_name(n.op) + ")";
}

// The profile as JSON (every node) or as text (the `top` largest, then the sum).
nlohmann::json profile_json(const Graph& graph, const Profile& profile, std::int64_t steps) {
  nlohmann::json list = nlohmann::json::array();
  for (const ProfiledNode& p : profile.nodes) {
    const Node& n = graph.node(p.node);
    list.push_back(
        {{"node", p.node.index}, {"label", n.label}, {"op", op_name(n.op)}, {"us", p.us}});
  }
  return {{"steps", steps}, {"sum_us", profile.sum_us}, {"nodes", list}};
}
void print_profile(std::ostream& out, const Graph& graph, const Profile& profile,
                   std::int64_t steps, const std::string& device) {
  const std::vector<ProfiledNode>& nodes = profile.nodes;
  const double sum = profile.sum_us;
  out << "profile (" << steps << " steps, median a node; "
      << (device == "cpu" ? "wall time" : "device time, eager, back to back") << "):\n";
  constexpr std::size_t kTop = 15;
  char line[64];
  for (std::size_t i = 0; i < std::min(kTop, nodes.size()); ++i) {
    std::snprintf(line, sizeof line, "  %9.2f us %5.1f%%  ", nodes[i].us,
                  sum > 0 ? 100 * nodes[i].us / sum : 0.0);
    out << line << node_name(graph, nodes[i].node) << "\n";
  }
  out << "  sum " << sum << " us over " << nodes.size() << " nodes; by op:";
  std::map<std::string, std::pair<double, int>> by_op;  // op -> (us, nodes)
  for (const ProfiledNode& p : nodes) {
    auto& [us, count] = by_op[op_name(graph.node(p.node).op)];
    us += p.us;
    ++count;
  }
  for (const auto& [op, total] : by_op) {
    std::snprintf(line, sizeof line, " %s %.1f us (%d)", op.c_str(), total.first, total.second);
    out << line;
  }
  out << "\n";
}

// bench --batch B > 1 (the header's note): `steps` timed steps after 4 untimed ones, each from
// step() to the device's idle, positions 1 .. steps + 4.
int bench_batched(const ModelArgs& m, std::int64_t batch, std::int64_t steps, std::int64_t profile,
                  bool json) {
  ProgressBar bar(json ? nullptr : &std::cerr);
  LoadedModel loaded;
  DecodeModel model = load_and_build(m, batch, bar, loaded);
  const Device device = parse_device(m.device);
  const DecisionLog decisions =
      optimize_graph(model.graph, model.attention_specs, optimize_options(m, device, bar),
                     model.kda_specs, model.layer_specs);
  SessionOptions so;
  so.device = device;
  so.measure_host_overhead = true;
  so.name = "decode step (batch " + std::to_string(batch) + ")";
  Session session(std::move(model.graph), so);
  bar.done();
  // [batch] i32: the first token of every row, then the same ids every step; on the session's
  // device (uploaded once, as Generator feeds its prompt).
  Tensor tokens_host = Tensor::empty({batch}, DType::i32);
  for (std::int64_t r = 0; r < batch; ++r)
    tokens_host.data<std::int32_t>()[r] = static_cast<std::int32_t>(r % loaded.config.vocab_size);
  const Tensor tokens = device.is_cpu() ? tokens_host : tokens_host.to_device(device);
  const auto step = [&](std::int64_t i) {
    session.step({{"k_len", i + 1}}, {{"tokens", tokens}});
#ifdef SPLICE_WITH_CUDA
    if (device.is_cuda()) cuda::synchronize();
#endif
  };
  StepTimes t = time_steps(steps, session, step);
  const Profile profiled = profile_steps(session, steps + 4, profile, step);
  const auto [p50, p99] = p50_p99(t.total);
  const double host50 = p50_p99(t.host).first;
  const double tokens_per_s = static_cast<double>(batch) * 1e6 / p50;
  if (json) {
    nlohmann::json j{{"model", loaded.source},
                     {"device", m.device},
                     {"batch", batch},
                     {"steps", t.total.size()},
                     {"p50_us", p50},
                     {"p99_us", p99},
                     {"tokens_per_s", tokens_per_s},
                     {"host_overhead_us_p50", host50},
                     {"cuda_graph", session.cuda_graph_status()},
                     {"decisions", decisions_json(decisions)}};
    if (profile > 0) j["profile"] = profile_json(session.graph(), profiled, profile);
    std::cout << j.dump(2) << "\n";
  } else {
    std::cout << loaded.source << " on " << m.device << ", batch " << batch << ": "
              << t.total.size() << " steps, p50 " << p50 << " us, p99 " << p99 << " us, "
              << tokens_per_s << " tokens/s (" << batch << " a step), host overhead " << host50
              << " us/step (p50)\n";
    if (device.is_cuda())
      std::cout << "cuda graph, each arm choice:\n" << session.cuda_graph_status();
    if (profile > 0) print_profile(std::cout, session.graph(), profiled, profile, m.device);
  }
  return 0;
}

std::vector<std::int32_t> parse_ids(const std::string& text, const char* what) {
  std::vector<std::int32_t> ids;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      std::size_t used = 0;
      ids.push_back(std::stoi(item, &used));
      if (used != item.size()) throw std::invalid_argument(item);
    } catch (const std::exception&) {
      fail<ValueError>(what, " must be comma-separated token ids, got '", item, "'");
    }
  }
  return ids;
}

std::vector<std::int32_t> prompt_tokens(const Opened& o, const std::string& prompt,
                                        const std::string& ids) {
  if (!ids.empty()) return parse_ids(ids, "--prompt-ids");
  if (!o.loaded.tokenizer) {
    if (!prompt.empty())
      fail<ValueError>("--prompt: this model has no tokenizer; use --prompt-ids");
    const auto& bos = o.loaded.config.bos_token_ids;
    return {bos.empty() ? 0 : static_cast<std::int32_t>(bos.front())};
  }
  std::vector<std::int32_t> t =
      o.loaded.tokenizer->encode(prompt.empty() ? "Once upon a time" : prompt);
  if (o.loaded.tokenizer->add_bos() && o.loaded.tokenizer->bos_id())
    t.insert(t.begin(), *o.loaded.tokenizer->bos_id());
  if (t.empty()) fail<ValueError>("--prompt encodes to no tokens");
  return t;
}

}  // namespace

Runner add_run(CLI::App& app) {
  auto m = std::make_shared<ModelArgs>();
  auto prompt = std::make_shared<std::string>();
  auto ids = std::make_shared<std::string>();
  auto stop = std::make_shared<std::string>();
  auto gen = std::make_shared<GenerateOptions>();
  auto json = std::make_shared<bool>(false);
  auto logits_out = std::make_shared<std::string>();
  add_model_options(app, *m);
  app.add_option(
      "--logits-out", *logits_out,
      "write logits to a safetensors file: `logits` [vocab] at the last prompt position and "
      "`all_logits` [steps, vocab] after every fed token (prompt and generated)");
  app.add_option("--prompt", *prompt, "prompt text (needs the model's tokenizer)");
  app.add_option("--prompt-ids", *ids, "prompt as comma-separated token ids");
  app.add_option("--max-new-tokens", gen->max_new_tokens, "token budget")->capture_default_str();
  app.add_option("--temperature", gen->sampling.temperature, "0 = greedy")->capture_default_str();
  app.add_option("--top-k", gen->sampling.top_k, "0 = off")->capture_default_str();
  app.add_option("--top-p", gen->sampling.top_p, "1 = off")->capture_default_str();
  app.add_option("--seed", gen->sampling.seed, "sampling seed")->capture_default_str();
  app.add_option("--stop", *stop, "comma-separated stop token ids (default: the model's eos)");
  app.add_flag("--json", *json, "machine-readable output (tokens, logits of the prompt, timings)");
  return [=]() {
    validate(*gen);  // before the model loads and the report starts
    Opened o = open(*m, *json, gen->sampling.temperature > 0.0f);
    GenerateOptions options = *gen;
    options.stop_tokens = stop->empty() ? std::vector<std::int32_t>{} : parse_ids(*stop, "--stop");
    if (stop->empty())
      for (auto id : o.loaded.config.eos_token_ids)
        options.stop_tokens.push_back(static_cast<std::int32_t>(id));
    const std::vector<std::int32_t> prompt_ids = prompt_tokens(o, *prompt, *ids);
    o.generator->check_generate(prompt_ids, options);  // before the report starts
    std::unique_ptr<StreamDecoder> stream;
    if (o.loaded.tokenizer && !*json) stream = std::make_unique<StreamDecoder>(*o.loaded.tokenizer);
    if (!*json) {
      std::cout << "model: " << o.loaded.source << " (" << o.loaded.config.architecture << ", "
                << o.loaded.config.num_hidden_layers << " layers) on " << m->device << "\n";
      std::cout << "decisions:\n" << o.generator->decisions().str();
      if (o.loaded.tokenizer)
        std::cout << "prompt: " << o.loaded.tokenizer->decode(prompt_ids) << "\n";
      std::cout << "prompt ids:";
      for (auto t : prompt_ids) std::cout << " " << t;
      // Streamed as they come: the text after "output:" with a tokenizer, else the ids after
      // "tokens:" (the line the report ends with either way).
      std::cout << (stream ? "\noutput: " : "\ntokens:") << std::flush;
      options.on_token = [&](std::int32_t t) {
        if (stream)
          std::cout << stream->push(t) << std::flush;
        else
          std::cout << " " << t << std::flush;
      };
    }
    options.keep_logits = !logits_out->empty();
    const GenerateResult r = o.generator->generate(prompt_ids, options);
    if (!logits_out->empty())
      save_safetensors(*logits_out, {{"logits", r.prompt_logits}, {"all_logits", r.all_logits}});
    std::vector<double> s = r.step_us;
    std::sort(s.begin(), s.end());
    const double p50 = s.empty() ? 0 : s[s.size() / 2];
    if (*json) {
      nlohmann::json j;
      j["prompt_ids"] = prompt_ids;
      j["tokens"] = r.tokens;
      if (o.loaded.tokenizer) j["text"] = o.loaded.tokenizer->decode(r.tokens);
      j["stopped_on_token"] = r.stopped_on_token;
      j["prefill_seconds"] = r.prefill_seconds;
      j["step_us_p50"] = p50;
      j["greedy_path"] = r.greedy_in_step ? "in_step" : "host";
      j["decisions"] = decisions_json(o.generator->decisions());
      std::cout << j.dump(2) << "\n";
      return 0;
    }
    if (stream) {
      std::cout << stream->flush() << "\ntokens:";
      for (auto t : r.tokens) std::cout << " " << t;
    }
    std::cout << "\n"
              << r.tokens.size() << " tokens; prefill " << prompt_ids.size() << " tokens in "
              << r.prefill_seconds * 1e3 << " ms; decode " << p50 << " us/token (p50), "
              << (p50 > 0 ? 1e6 / p50 : 0) << " tokens/s";
    if (options.sampling.temperature == 0.0f)
      std::cout << "; greedy: " << greedy_path(r.greedy_in_step, m->device);
    std::cout << "\n";
    return 0;
  };
}

Runner add_bench(CLI::App& app) {
  auto m = std::make_shared<ModelArgs>();
  auto steps = std::make_shared<std::int64_t>(128);
  auto batch = std::make_shared<std::int64_t>(1);
  auto profile = std::make_shared<std::int64_t>(0);
  auto json = std::make_shared<bool>(false);
  add_model_options(app, *m);
  app.add_option("--steps", *steps, "decode steps to time")
      ->capture_default_str()
      ->check(CLI::Range(8, 1 << 20));
  app.add_option("--batch", *batch,
                 "sequences decoded in lockstep; above 1 the step is timed alone (no token "
                 "chosen, tokens/s counts batch tokens a step)")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  app.add_option("--profile", *profile,
                 "after the timed steps, this many steps with every node timed (eagerly); "
                 "prints the nodes by median time")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 16));
  app.add_flag("--json", *json, "machine-readable output");
  return [=]() {
    // The timed steps, their warm-up, the profiled steps and the generate() pass after a reset
    // all decode from position 0: the caches need steps + profile + 8 positions. Raised when left
    // at its default, refused when the user asked for less.
    ModelArgs args = *m;
    const std::int64_t needed = *steps + *profile + 8;
    if (args.max_seq_len_given && args.max_seq_len < needed)
      fail<ValueError>("--max-seq-len ", args.max_seq_len, " holds fewer positions than --steps ",
                       *steps, " and --profile ", *profile, " need (", needed, "); pass at least ",
                       needed, " or leave it out");
    args.max_seq_len = std::max(args.max_seq_len, needed);
    if (*batch > 1) {
      if (args.host_greedy)
        fail<ValueError>("--host-greedy chooses tokens, which --batch ", *batch,
                         " does not (a batched bench times the step alone); drop one of them");
      return bench_batched(args, *batch, *steps, *profile, *json);
    }
    Opened o = open(args, *json);
    constexpr std::int32_t kFirstToken = 1;
    const bool in_step = o.generator->greedy_in_step();
    // Greedy decoding: each step appends the previous step's pick (in the step: it never leaves
    // the device; otherwise the logits come to the host for the argmax).
    const auto step = [&](std::int64_t i) {
      o.generator->step_greedy(i == 0 ? std::optional<std::int32_t>(kFirstToken) : std::nullopt);
    };
    StepTimes t = time_steps(*steps, o.generator->session(), step);
    const Profile profiled = profile_steps(o.generator->session(), *steps + 4, *profile, step);
    const Graph& graph = o.generator->session().graph();
    const auto [p50, p99] = p50_p99(t.total);
    const double host50 = p50_p99(t.host).first;
    // The decode loop as `run` drives it (generate(): pipelined where it can be, generate.h), the
    // same number of tokens from the start: the time between consecutive tokens, p50.
    o.generator->reset();
    GenerateOptions loop;
    loop.max_new_tokens = *steps;
    GenerateResult r = o.generator->generate({kFirstToken}, loop);
    std::sort(r.step_us.begin(), r.step_us.end());
    const double loop50 = r.step_us.empty() ? 0.0 : r.step_us[r.step_us.size() / 2];
    if (*json) {
      nlohmann::json j{{"model", o.loaded.source},
                       {"device", m->device},
                       {"steps", t.total.size()},
                       {"p50_us", p50},
                       {"p99_us", p99},
                       {"tokens_per_s", 1e6 / p50},
                       {"host_overhead_us_p50", host50},
                       {"greedy_path", in_step ? "in_step" : "host"},
                       {"generate_p50_us", loop50},
                       {"generate_tokens_per_s", loop50 > 0 ? 1e6 / loop50 : 0.0},
                       {"generate_pipelined", r.pipelined}};
      if (*profile > 0) j["profile"] = profile_json(graph, profiled, *profile);
      std::cout << j.dump(2) << "\n";
    } else {
      std::cout << o.loaded.source << " on " << m->device << ": " << t.total.size()
                << " steps, p50 " << p50 << " us, p99 " << p99 << " us, " << 1e6 / p50
                << " tokens/s, host overhead " << host50
                << " us/token (p50); greedy: " << greedy_path(in_step, m->device)
                << "; decode loop (generate" << (r.pipelined ? ", pipelined" : "") << "): p50 "
                << loop50 << " us/token\n";
      if (*profile > 0) print_profile(std::cout, graph, profiled, *profile, m->device);
    }
    return 0;
  };
}

}  // namespace splice::cli
