// Arm selection: extract, verify, time, choose, persist, explain (see select.h for the stages).
#include "splice/tune/select.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>

#include "splice/core/error.h"
#include "splice/plan/plan.h"

#ifdef SPLICE_WITH_CUDA
#include "splice/backend/cuda/runtime.h"
#endif

namespace splice {

// ---- generators ----

std::vector<std::int64_t> ArmInputGenerator::verification_points(std::int64_t lo,
                                                                 std::int64_t hi) const {
  std::vector<std::int64_t> points{lo};
  const std::int64_t mid = lo + (hi - lo) / 2;
  const std::int64_t misaligned =
      (mid % 2 == 0 && mid + 1 <= hi) ? mid + 1 : mid;  // odd: off any tile
  if (misaligned != lo) points.push_back(misaligned);
  if (hi != lo && hi != misaligned) points.push_back(hi);
  return points;
}

Tolerance ArmInputGenerator::tolerance(DType dtype, const std::string&) const {
  return default_tolerance(dtype);
}

bool ArmInputGenerator::bit_exact_state(const std::string&) const { return false; }

namespace {

class GenericGenerator : public ArmInputGenerator {
 public:
  void fill(const Graph& region, const ArmRecipe& recipe, Session& session, std::int64_t selector,
            Rng& rng, SymBindings& symbols, TensorMap& inputs) const override {
    for (NodeId id : region.live_nodes()) {
      const Node& n = region.node(id);
      if (n.op == Op::Input) {
        Tensor t = Tensor::empty(upper_bound_shape(n.shape, region.symbols()), n.dtype);
        rng.normal(t);
        inputs[n.attrs.name] = session.device().is_cpu() ? t : t.to_device(session.device());
      } else if (n.op == Op::State) {
        Tensor host = Tensor::empty(session.state(n.attrs.name).shape(), n.dtype);
        rng.normal(host);
        session.state(n.attrs.name)
            .copy_from(session.device().is_cpu() ? host : host.to_device(session.device()));
      }
    }
    bind_selector(region, recipe, selector, symbols);
  }
};

std::mutex g_registry_mutex;
std::map<std::string, std::shared_ptr<ArmInputGenerator>>& registry() {
  static std::map<std::string, std::shared_ptr<ArmInputGenerator>> r;
  return r;
}

}  // namespace

void bind_selector(const Graph& region, const ArmRecipe& recipe, std::int64_t selector,
                   SymBindings& symbols) {
  if (!recipe.selector || recipe.selector->is_concrete()) return;
  const SymExpr& e = recipe.selector->expr();
  if (e.kind() != SymExpr::Kind::symbol)
    fail<GraphError>("arm selection: the selector ", e.str(&region.symbols()),
                     " must be a plain symbol to be bound");
  symbols[region.symbols().info(e.symbol()).name] = selector;
}

void register_arm_generator(const std::string& kind, std::shared_ptr<ArmInputGenerator> generator) {
  std::lock_guard<std::mutex> lock(g_registry_mutex);
  registry()[kind] = std::move(generator);
}

void register_builtin_arm_generators();  // attention and KDA generators (generators.cc)

std::shared_ptr<ArmInputGenerator> arm_generator(const std::string& kind) {
  register_builtin_arm_generators();
  std::lock_guard<std::mutex> lock(g_registry_mutex);
  auto it = registry().find(kind);
  if (it != registry().end()) return it->second;
  static auto generic = std::make_shared<GenericGenerator>();
  return generic;
}

// ---- region extraction ----

Graph extract_arm_region(const Graph& g, NodeId branch, int arm) {
  const Node& b = g.node(branch);
  if (b.op != Op::Branch)
    fail<GraphError>("extract_arm_region: %", branch.index, " is not a branch");
  const ArmRecipe& recipe = b.attrs.branch->recipe;
  std::map<std::uint32_t, std::string> role_of;
  for (const auto& [role, id] : recipe.roles) role_of[id.index] = role;
  // Closure of the exit, stopping at role nodes.
  std::vector<bool> needed(g.size(), false);
  std::vector<NodeId> stack{b.inputs.at(static_cast<std::size_t>(arm))};
  while (!stack.empty()) {
    NodeId n = stack.back();
    stack.pop_back();
    if (needed[n.index]) continue;
    needed[n.index] = true;
    if (role_of.count(n.index)) continue;
    for (NodeId in : g.node(n).inputs) stack.push_back(in);
  }
  Graph region;
  for (std::size_t i = 0; i < g.symbols().size(); ++i) {
    const SymInfo& s = g.symbols().info(SymId{static_cast<std::uint32_t>(i)});
    region.declare_symbol(s.name, s.lo, s.hi);
  }
  std::vector<NodeId> remap(g.size());
  for (NodeId id : topological_order(g)) {
    if (!needed[id.index]) continue;
    const Node& n = g.node(id);
    auto role = role_of.find(id.index);
    if (role != role_of.end() && n.op != Op::Param && n.op != Op::Constant) {
      remap[id.index] = (n.op == Op::State) ? region.state(role->second, n.shape, n.dtype)
                                            : region.input(role->second, n.shape, n.dtype);
      continue;
    }
    Node copy = n;
    for (NodeId& in : copy.inputs) in = remap[in.index];
    if (copy.attrs.flash) copy.attrs.flash = std::make_shared<FlashDecodeAttrs>(*copy.attrs.flash);
    if (copy.attrs.kda) copy.attrs.kda = std::make_shared<KdaAttrs>(*copy.attrs.kda);
    remap[id.index] = region.append(std::move(copy));
  }
  region.mark_output("out", remap[b.inputs[static_cast<std::size_t>(arm)].index]);
  verify_graph(region);
  return region;
}

std::vector<std::pair<std::int64_t, std::int64_t>> selector_buckets(std::int64_t lo,
                                                                    std::int64_t hi,
                                                                    std::int64_t max_buckets) {
  std::vector<std::pair<std::int64_t, std::int64_t>> buckets;
  std::int64_t start = lo;
  std::int64_t top = 1;
  while (top < lo) top <<= 1;
  while (start <= hi) {
    std::int64_t end = std::min(top, hi);
    if (static_cast<std::int64_t>(buckets.size()) + 1 >= max_buckets) end = hi;
    buckets.emplace_back(start, end);
    start = end + 1;
    top <<= 1;
  }
  return buckets;
}

namespace {

using Clock = std::chrono::steady_clock;

void device_sync(Device d) {
#ifdef SPLICE_WITH_CUDA
  if (d.is_cuda()) cuda::synchronize();
#else
  (void)d;
#endif
}

Tensor to_host(const Tensor& t) { return t.device().is_cpu() ? t : t.to_device(Device::cpu()); }

std::string shape_key(const Graph& g, NodeId branch) {
  const Node& b = g.node(branch);
  std::ostringstream key;
  const ArmRecipe& r = b.attrs.branch->recipe;
  for (const auto& [role, id] : r.roles) {
    const Node& n = g.node(id);
    key << role << ":" << dtype_name(n.dtype) << dims_str(upper_bound_shape(n.shape, g.symbols()))
        << ";";
  }
  for (std::size_t arm = 1; arm < b.inputs.size(); ++arm) {
    const Node& e = g.node(b.inputs[arm]);
    if (e.attrs.flash) {
      const auto& f = *e.attrs.flash;
      key << "flash:" << f.softmax_scale << (f.causal ? ",causal" : "")
          << ",wl=" << (f.window_left ? *f.window_left : -1)
          << ",wr=" << (f.window_right ? *f.window_right : -1)
          << ",cap=" << (f.softcap ? *f.softcap : 0.0f) << (f.has_alibi ? ",alibi" : "") << ";";
    }
    if (e.attrs.kda) {
      const auto& k = *e.attrs.kda;
      key << "kda:lb=" << (k.lower_bound ? *k.lower_bound : 0.0f) << ",eps=" << k.norm_eps
          << (k.packed ? ",packed" : ",plain") << ";";
    }
    if (e.op == Op::RmsNorm || e.op == Op::RmsNormMatMul || e.op == Op::RmsNormMatMulRopeKvAppend ||
        e.op == Op::RmsNormMatMulSwiglu) {
      std::ostringstream eps;  // full precision: 1e-5 and 1e-6 models must not share decisions
      eps.precision(9);
      eps << e.attrs.eps;
      key << "rms_norm:eps=" << eps.str() << ";";
    }
  }
  if (r.output_tolerance) {  // the verification bound decides which arms verify
    std::ostringstream bound;
    bound.precision(9);
    bound << "tol=" << r.output_tolerance->atol << "," << r.output_tolerance->rtol << ";";
    key << bound.str();
  }
  return key.str();
}

// Checks one cached bucket decision against what select_arms writes: per-arm arrays of one
// length (verified: bool, max_abs_error / max_rel_error: number, failure: string, median_us:
// number or null), a winner that is a verified arm, a reason. A damaged or hand-edited entry is an
// IoError naming the file and the key, raised when the cache loads, before any branch is touched:
// it must never pick an arm that was not verified, or one the branch does not have.
void check_cache_entry(const std::string& path, const std::string& key, const nlohmann::json& e) {
  const auto malformed = [&](const std::string& why) {
    fail<IoError>("tuning cache ", path, ": entry \"", key, "\" ", why,
                  " (delete the file to re-tune)");
  };
  if (!e.is_object()) malformed("is not an object");
  const auto field = [&](const char* name) -> const nlohmann::json& {
    const auto f = e.find(name);
    if (f == e.end()) malformed(std::string("has no `") + name + "`");
    return *f;
  };
  const nlohmann::json& verified = field("verified");
  if (!verified.is_array() || verified.empty())
    malformed("has a `verified` that is not a non-empty array");
  const std::size_t arms = verified.size();
  const auto per_arm = [&](const char* name, auto&& element_ok) {
    const nlohmann::json& a = field(name);
    if (!a.is_array() || a.size() != arms)
      malformed(std::string("has a `") + name + "` that is not an array of " +
                std::to_string(arms) + " (one per arm)");
    for (const auto& x : a)
      if (!element_ok(x)) malformed(std::string("has a `") + name + "` element of the wrong type");
  };
  per_arm("verified", [](const nlohmann::json& x) { return x.is_boolean(); });
  per_arm("max_abs_error", [](const nlohmann::json& x) { return x.is_number(); });
  per_arm("max_rel_error", [](const nlohmann::json& x) { return x.is_number(); });
  per_arm("failure", [](const nlohmann::json& x) { return x.is_string(); });
  per_arm("median_us", [](const nlohmann::json& x) { return x.is_number() || x.is_null(); });
  if (!field("reason").is_string()) malformed("has a `reason` that is not a string");
  const nlohmann::json& winner = field("winner");
  if (!winner.is_number_integer() || winner.get<std::int64_t>() < 0 ||
      winner.get<std::int64_t>() >= static_cast<std::int64_t>(arms))
    malformed("has a `winner` that is not an arm index in [0, " + std::to_string(arms) + ")");
  if (!verified[winner.get<std::size_t>()].get<bool>())
    malformed("names arm " + std::to_string(winner.get<std::int64_t>()) +
              " as the winner, which it does not record as verified");
}

nlohmann::json load_cache(const std::string& path) {
  if (path.empty() || !std::filesystem::exists(path)) return nlohmann::json::object();
  std::ifstream in(path);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception&) {
  }
  if (!j.is_object() || !j.contains("format") || j["format"] != "splice-tuning-cache-v1")
    fail<IoError>("tuning cache ", path, " is not a splice tuning cache (delete it to re-tune)");
  if (j.contains("entries")) {
    if (!j["entries"].is_object())
      fail<IoError>("tuning cache ", path,
                    ": `entries` is not an object (delete the file to re-tune)");
    for (const auto& [key, entry] : j["entries"].items()) check_cache_entry(path, key, entry);
  }
  return j;
}

void save_cache(const std::string& path, const nlohmann::json& j) {
  if (path.empty()) return;
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    if (!out) fail<IoError>("cannot write tuning cache ", tmp);
    out << j.dump(2) << "\n";
  }
  std::filesystem::rename(tmp, path);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? NAN : v[v.size() / 2];
}

}  // namespace

std::string tuning_device_key(Device device) {
#ifdef SPLICE_WITH_CUDA
  if (device.is_cuda()) return cuda::device_name(device.index);
#endif
  return device.str();
}

void select_arms(Graph& graph, DecisionLog& log, const TuneOptions& opt) {
  const std::string device_key =
      opt.device_name.empty() ? tuning_device_key(opt.device) : opt.device_name;
  nlohmann::json cache = load_cache(opt.cache_path);
  cache["format"] = "splice-tuning-cache-v1";
  if (!cache.contains("entries")) cache["entries"] = nlohmann::json::object();
  bool cache_dirty = false;
  std::vector<NodeId> branches;
  for (NodeId id : graph.live_nodes())
    if (graph.node(id).op == Op::Branch) branches.push_back(id);

  for (NodeId branch : branches) {
    const Node& bnode = graph.node(branch);
    BranchAttrs& attrs = *graph.mutable_node(branch).attrs.branch;
    const ArmRecipe& recipe = attrs.recipe;
    const std::size_t num_arms = bnode.inputs.size();
    Decision* decision = log.find_branch(branch);
    if (!decision) {
      Decision d;
      d.kind = recipe.kind;
      d.offered = true;
      d.reason = "branch built by the model";
      d.branch = branch;
      d.arm_labels = attrs.arm_labels;
      decision = &log.add(d);
    }
    auto generator = arm_generator(recipe.kind);
    // Selector range.
    std::int64_t lo = 0, hi = 0;
    if (recipe.selector) {
      lo = std::max<std::int64_t>(recipe.selector->expr().lower_bound(graph.symbols()), 1);
      hi = recipe.selector->upper_bound(graph.symbols());
    }
    const auto buckets = selector_buckets(lo, hi, opt.max_buckets);
    // CUDA arms are timed by their device span (step 2 below), and the key says so: decisions
    // timed by wall clock before session 56 are not reused.
    const bool device_span = opt.device.is_cuda();
    const std::string base_key = device_key + (device_span ? "|device-span" : "") + "|" +
                                 recipe.kind + "|" + recipe.contract_revision + "|" +
                                 dtype_name(bnode.dtype) + "|" + shape_key(graph, branch);

    // Regions and sessions are built lazily: a full cache hit measures nothing.
    std::vector<std::unique_ptr<Session>> sessions;
    std::vector<Graph> regions;
    auto ensure_sessions = [&] {
      if (!sessions.empty()) return;
      for (std::size_t arm = 0; arm < num_arms; ++arm) {
        regions.push_back(extract_arm_region(graph, branch, static_cast<int>(arm)));
        SessionOptions so;
        so.device = opt.device;
        // Both arms run eagerly while tuning: a captured graph would copy the (large) region
        // inputs into session buffers every step, charging the fused arm for what decode never
        // pays, and the decomposed arm cannot be captured at all.
        so.cuda_graph = false;
        sessions.push_back(std::make_unique<Session>(regions.back(), so));
      }
    };
    auto run_arm = [&](std::size_t arm, std::int64_t selector, std::uint64_t seed) {
      Rng rng(seed);
      SymBindings symbols;
      TensorMap inputs;
      generator->fill(regions[arm], recipe, *sessions[arm], selector, rng, symbols, inputs);
      sessions[arm]->step(symbols, inputs);
      return std::make_pair(symbols, inputs);
    };

    // The branch as an error raised while measuring it names it.
    const std::string where = "branch %" + std::to_string(branch.index) + " (" + recipe.kind +
                              (decision->site.empty() ? "" : " at " + decision->site) + ")";
    // Steps 1-3 for one bucket with no cache entry: verify every arm against arm 0 at the
    // generator's points, time the verified ones at the bucket's top, choose.
    auto measure_bucket = [&](BucketDecision& bd, std::int64_t blo, std::int64_t bhi) {
      ensure_sessions();
      bd.verified[0] = true;
      // 1. Verify.
      std::uint64_t seed = opt.seed;
      for (std::int64_t point : generator->verification_points(blo, bhi)) {
        ++seed;
        run_arm(0, point, seed);
        const Tensor oracle = to_host(sessions[0]->output("out")).clone();
        std::map<std::string, Tensor> oracle_states;
        for (NodeId id : regions[0].live_nodes())
          if (regions[0].node(id).op == Op::State)
            oracle_states[regions[0].node(id).attrs.name] =
                to_host(sessions[0]->state(regions[0].node(id).attrs.name)).clone();
        for (std::size_t arm = 1; arm < num_arms; ++arm) {
          if (!bd.failure[arm].empty()) continue;
          try {
            run_arm(arm, point, seed);
          } catch (const Error& e) {
            bd.failure[arm] = std::string("arm raised: ") + e.what();
            continue;
          }
          const Tensor got = to_host(sessions[arm]->output("out"));
          const Tolerance exit_tolerance =
              recipe.output_tolerance.value_or(generator->tolerance(got.dtype(), ""));
          CompareReport r = compare_tensors(got, oracle, exit_tolerance);
          bd.max_abs_error[arm] = std::max(bd.max_abs_error[arm], r.max_abs_error);
          bd.max_rel_error[arm] = std::max(bd.max_rel_error[arm], r.max_rel_error);
          if (!r.ok) {
            bd.failure[arm] = "output at selector " + std::to_string(point) + ": " + r.str();
            continue;
          }
          for (const auto& [name, expected] : oracle_states) {
            const Tensor st = to_host(sessions[arm]->state(name));
            CompareReport rs =
                generator->bit_exact_state(name)
                    ? compare_bits(st, expected)
                    : compare_tensors(st, expected, generator->tolerance(st.dtype(), name));
            if (!rs.ok) {
              bd.failure[arm] =
                  "state '" + name + "' at selector " + std::to_string(point) + ": " + rs.str();
              break;
            }
          }
        }
      }
      for (std::size_t arm = 1; arm < num_arms; ++arm) bd.verified[arm] = bd.failure[arm].empty();
      // 2. Time every verified arm at the bucket's top: each warmed up, then the repeats
      //    interleaved arm by arm, so that a drift of the machine while the bucket is timed
      //    (clocks ramping, other load) is shared by the arms instead of charged to one. On CUDA
      //    a repeat is the region's device span: the step runs profiled (Session::
      //    set_profile_nodes: its nodes back to back behind a hold, the warm-up sizing the hold),
      //    so the host's dispatch, which a replayed decode step never pays, stays out of the
      //    comparison. Timed as wall clock it was ~13 us of an 18 us layer-op region, and a saved
      //    launch worth 7% of the replayed step fell inside the win margin (perf.md run 392). On
      //    the CPU, wall clock.
      std::vector<std::size_t> timed;
      std::vector<SymBindings> arm_symbols(num_arms);
      std::vector<TensorMap> arm_inputs(num_arms);
      std::vector<std::vector<double>> times(num_arms);
      for (std::size_t arm = 0; arm < num_arms; ++arm) {
        if (!bd.verified[arm]) continue;
        if (opt.time_override) {
          bd.median_us[arm] = opt.time_override(branch, static_cast<int>(arm), bhi);
          continue;
        }
        Rng rng(opt.seed);
        generator->fill(regions[arm], recipe, *sessions[arm], bhi, rng, arm_symbols[arm],
                        arm_inputs[arm]);
        sessions[arm]->set_profile_nodes(device_span);
        for (int i = 0; i < opt.warmup; ++i) sessions[arm]->step(arm_symbols[arm], arm_inputs[arm]);
        timed.push_back(arm);
      }
      device_sync(opt.device);
      for (int i = 0; i < opt.repeats; ++i)
        for (std::size_t arm : timed) {
          const auto t0 = Clock::now();
          sessions[arm]->step(arm_symbols[arm], arm_inputs[arm]);
          device_sync(opt.device);
          times[arm].push_back(
              device_span ? sessions[arm]->last_profile_span_us()
                          : std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
        }
      for (std::size_t arm : timed) {
        bd.median_us[arm] = median(times[arm]);
        sessions[arm]->set_profile_nodes(false);
      }
      // 3. Choose.
      bd.winner = 0;
      bd.reason = "arm 0 (oracle): no verified fused arm";
      double best = bd.median_us[0];
      for (std::size_t arm = 1; arm < num_arms; ++arm) {
        if (!bd.verified[arm]) continue;
        if (std::isnan(bd.median_us[arm]) || std::isnan(best)) {
          bd.reason = "missing timing keeps arm 0";
          continue;
        }
        if (bd.median_us[arm] < best * (1.0 - opt.win_margin)) {
          best = bd.median_us[arm];
          bd.winner = static_cast<int>(arm);
          bd.reason = "fastest verified";
        } else if (bd.winner == 0) {
          bd.reason = "tie or slower keeps arm 0";
        }
      }
    };

    attrs.dispatch.clear();
    for (const auto& [blo, bhi] : buckets) {
      const std::string key = base_key + "|" + std::to_string(blo) + "-" + std::to_string(bhi);
      BucketDecision bd;
      bd.lo = blo;
      bd.hi = bhi;
      bd.verified.assign(num_arms, false);
      bd.max_abs_error.assign(num_arms, 0.0);
      bd.max_rel_error.assign(num_arms, 0.0);
      bd.failure.assign(num_arms, "");
      bd.median_us.assign(num_arms, NAN);
      auto hit = cache["entries"].find(key);
      if (hit != cache["entries"].end() && (*hit)["verified"].size() == num_arms) {
        const auto& e = *hit;
        bd.winner = e["winner"].get<int>();
        for (std::size_t a = 0; a < num_arms; ++a) {
          bd.verified[a] = e["verified"][a].get<bool>();
          bd.max_abs_error[a] = e["max_abs_error"][a].get<double>();
          bd.max_rel_error[a] = e["max_rel_error"][a].get<double>();
          bd.failure[a] = e["failure"][a].get<std::string>();
          bd.median_us[a] = e["median_us"][a].is_null() ? NAN : e["median_us"][a].get<double>();
        }
        bd.reason = e["reason"].get<std::string>();
        bd.from_cache = true;
      } else {
        if (opt.progress)
          opt.progress("tuning " + decision->site + " bucket [" + std::to_string(blo) + ", " +
                       std::to_string(bhi) + "]");
        try {
          measure_bucket(bd, blo, bhi);
        } catch (const Error&) {
          rethrow_with_context("arm selection of " + where + ", bucket [" + std::to_string(blo) +
                               ", " + std::to_string(bhi) + "]: ");
        }
        // 4. Persist.
        nlohmann::json e;
        e["winner"] = bd.winner;
        e["reason"] = bd.reason;
        for (std::size_t a = 0; a < num_arms; ++a) {
          e["verified"].push_back(static_cast<bool>(bd.verified[a]));
          e["max_abs_error"].push_back(bd.max_abs_error[a]);
          e["max_rel_error"].push_back(bd.max_rel_error[a]);
          e["failure"].push_back(bd.failure[a]);
          e["median_us"].push_back(std::isnan(bd.median_us[a]) ? nlohmann::json()
                                                               : nlohmann::json(bd.median_us[a]));
        }
        cache["entries"][key] = e;
        cache_dirty = true;
      }
      attrs.dispatch.push_back({blo, bhi, bd.winner});
      decision->buckets.push_back(bd);
    }
    // One arm everywhere: collapse the branch (a plain graph again); otherwise keep the dispatch.
    if (opt.collapse_unanimous && !attrs.dispatch.empty()) {
      const int first = attrs.dispatch.front().arm;
      bool unanimous = true;
      for (const auto& c : attrs.dispatch) unanimous &= c.arm == first;
      if (unanimous) {
        collapse(graph, branch, first);
        decision->collapsed_to = first;
      }
    }
  }
  eliminate_dead_code(graph);
  verify_graph(graph);
  if (cache_dirty) save_cache(opt.cache_path, cache);
}

}  // namespace splice
