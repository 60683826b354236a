// splice/exec/session.h: a planned-once graph that runs one step per token.
//
// Construction verifies the graph, plans it once (plan.h), allocates the arena and the
// persistent state buffers (zeroed) and keeps weights on the session's device. Each `step`:
//   1. binds the step's symbols in a fresh SymEnv (write-once, range-checked);
//   2. checks every input (name, dtype, shape under the bindings, device) and evaluates every
//      shape, slice bound, write offset and branch selector BEFORE anything runs, so a bad step
//      throws with caches untouched;
//   3. picks each branch's arm from its dispatch table (bucket of the bound selector; arm 0 when
//      undecided) and runs the schedule, skipping the other arms' regions;
//   4. optionally (shadow_every = N) also runs the oracle arm every Nth step for branches whose
//      arms write no state, compares the exits under the branch's tolerance and demotes a fast arm
//      that drifts (the bucket falls back to arm 0, and the event is recorded).
// No re-planning happens after construction; outputs are views into the arena, valid until the
// next step.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "splice/core/tolerance.h"
#include "splice/ir/graph.h"
#include "splice/plan/plan.h"

namespace splice {

struct SessionOptions {
  Device device = Device::cpu();
  int shadow_every = 0;  // 0: no shadow check
  // Tolerance of a branch's shadow check, by the exit's dtype (default_tolerance otherwise).
  std::function<Tolerance(const Graph&, NodeId branch)> shadow_tolerance;
  // Time each kernel call so that host overhead = step time - kernel time (adds ~50 ns a node).
  bool measure_host_overhead = false;
};

struct StepTiming {
  double total_us = 0;   // the whole step() call
  double kernel_us = 0;  // inside kernel calls (with measure_host_overhead)
  double host_us() const { return total_us - kernel_us; }
};

struct ShadowEvent {
  std::int64_t step = 0;
  NodeId branch;
  int arm = 0;                 // the arm that was checked
  std::int64_t selector = 0;   // its bound value
  CompareReport report;
  bool demoted = false;
};

using SymBindings = std::map<std::string, std::int64_t>;
using TensorMap = std::map<std::string, Tensor>;

class Session {
 public:
  explicit Session(Graph graph, SessionOptions options = {});
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  void step(const SymBindings& symbols, const TensorMap& inputs = {});

  Tensor output(const std::string& name) const;
  Tensor state(const std::string& name) const;  // the persistent buffer itself
  void reset_states();                          // zero every state buffer

  const Graph& graph() const { return graph_; }
  const Plan& plan() const { return plan_; }
  Device device() const { return options_.device; }
  std::int64_t steps() const { return steps_; }
  const std::vector<ShadowEvent>& shadow_events() const { return shadow_events_; }
  // The arm each branch ran in the last step, in plan().branches order.
  const std::vector<int>& last_choices() const { return choices_; }
  const StepTiming& last_timing() const { return timing_; }

 private:
  struct Impl;
  Graph graph_;
  SessionOptions options_;
  Plan plan_;
  std::unique_ptr<Impl> impl_;
  std::int64_t steps_ = 0;
  std::vector<ShadowEvent> shadow_events_;
  std::vector<int> choices_;
  StepTiming timing_;
};

// The arm a branch's dispatch table picks for `selector` (arm 0 outside every bucket).
int dispatch_arm(const BranchAttrs& branch, std::int64_t selector);

}  // namespace splice
