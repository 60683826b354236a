// splice/tune/select.h: verified and timed arm selection (spec decode_attention.md §4), shared by
// every fused kernel kind.
//
// For each Op::Branch, per device and per selector bucket (powers of two up to the selector's
// upper bound, e.g. k_len buckets [1,1], [2,2], [3,4], ..., [cap/2+1, cap]):
//   1. Verify each fused arm against arm 0 (the oracle) on generated inputs: the region between
//      the recipe's role nodes and the arm's exit is extracted as its own graph (roles become
//      inputs or fresh states; weights stay), and an ArmInputGenerator for the recipe's kind fills
//      it (for attention: k_len = 1, a tile-misaligned value and the bucket's top, cache rows at
//      and beyond k_len poisoned with NaN). Outputs, and states the arm writes, are compared under
//      the bound the recipe carries from the kernel's contract row (the exit; flash decode) or
//      else the kind's tolerance (the generator's); a failure disqualifies the arm for that bucket
//      with its max abs/rel error and worst index recorded.
//   2. Time every arm at the bucket's top length: warm-up, then the median of repeats, taken
//      interleaved across the arms (a drift of the machine is shared, not charged to one arm).
//      On CUDA a repeat is the region's device span (its nodes back to back behind a hold:
//      Session::set_profile_nodes, last_profile_span_us), not the host's wall clock: a decode
//      step replays a CUDA graph, which pays no dispatch. On the CPU, wall clock.
//   3. Choose the fastest verified arm; a fused arm must beat arm 0 by `win_margin` (ties and
//      missing data keep arm 0).
//   4. Persist every decision in a JSON tuning cache keyed by device (and on CUDA the timing
//      method, "device-span"), kind, kernel revision, dtypes, shapes and bucket; a later run with
//      the same key reuses it without measuring.
//      The whole file is checked when it loads (per-arm arrays, a winner that is a verified arm):
//      a damaged one is an IoError naming it and the entry, before any branch changes.
//   5. Explain: each bucket's numbers and winner go into the DecisionLog.
// The branch then carries a dispatch table (bucket -> arm); a branch whose buckets all pick one
// arm is collapsed to it and dead-code elimination removes the loser.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "splice/core/random.h"
#include "splice/exec/session.h"
#include "splice/passes/decisions.h"

namespace splice {

// Fills the extracted region of one branch for a verification or timing run.
class ArmInputGenerator {
 public:
  virtual ~ArmInputGenerator() = default;
  // Selector values to verify inside the bucket [lo, hi].
  virtual std::vector<std::int64_t> verification_points(std::int64_t lo, std::int64_t hi) const;
  // Fills every role input (into `inputs`) and every role state (in place, through the
  // session) and binds the selector symbol to `selector`. Must be deterministic in `rng`.
  virtual void fill(const Graph& region, const ArmRecipe& recipe, Session& session,
                    std::int64_t selector, Rng& rng, SymBindings& symbols,
                    TensorMap& inputs) const = 0;
  // Tolerance of the region's output (and of `state` when a state name is given).
  virtual Tolerance tolerance(DType dtype, const std::string& state) const;
  // States compared bit for bit (copies, cache writes).
  virtual bool bit_exact_state(const std::string& state) const;
};

// Binds the recipe's selector symbol to `selector` (the selector must be a plain symbol or
// concrete); shared by the generators.
void bind_selector(const Graph& region, const ArmRecipe& recipe, std::int64_t selector,
                   SymBindings& symbols);

// Generators by recipe kind ("flash_decode", "kda_decode"); an unknown kind gets a generic one
// that fills every float input with N(0, 1).
void register_arm_generator(const std::string& kind, std::shared_ptr<ArmInputGenerator> generator);
std::shared_ptr<ArmInputGenerator> arm_generator(const std::string& kind);

// The tuning cache's device key for `device`: "cpu", or a CUDA device's name ("NVIDIA H200"), so
// decisions measured on one kind of device are never reused on another.
std::string tuning_device_key(Device device);

struct TuneOptions {
  Device device = Device::cpu();
  std::string device_name;  // tuning-cache key; empty: tuning_device_key(device)
  std::string cache_path;   // JSON tuning cache ("" = none)
  int warmup = 2;
  int repeats = 9;
  double win_margin = 0.05;       // a fused arm must be >= 5% faster than arm 0
  std::int64_t max_buckets = 12;  // the top buckets merge beyond this
  std::uint64_t seed = 20261130;
  bool collapse_unanimous = true;
  // Replaces measured times (tests only): (branch, arm, selector) -> microseconds.
  std::function<double(NodeId, int, std::int64_t)> time_override;
  // Progress messages ("tuning layer3.attn bucket [257, 512]") for a progress bar.
  std::function<void(const std::string&)> progress;
};

// Verifies, times and chooses arms for every branch of `graph`, writing dispatch tables (and
// collapsing unanimous branches), and records the numbers in `log`.
void select_arms(Graph& graph, DecisionLog& log, const TuneOptions& options);

// Buckets of a selector range: [lo, lo], then powers of two, the last ending at hi.
std::vector<std::pair<std::int64_t, std::int64_t>> selector_buckets(std::int64_t lo,
                                                                    std::int64_t hi,
                                                                    std::int64_t max_buckets);

// A branch's region for one arm as a standalone graph: role nodes become inputs (or fresh states
// when the role is a state; weights stay weights), the exit is output "out".
Graph extract_arm_region(const Graph& graph, NodeId branch, int arm);

}  // namespace splice
