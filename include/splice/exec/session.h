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
//      that drifts (the bucket falls back to arm 0, and the event is recorded);
//   5. optionally runs the caller's epilogue on the step's outputs (SessionOptions::epilogue;
//      on CUDA it is captured with the step and replayed with it).
// No re-planning happens after construction; outputs are views into the arena, valid until the
// next step.
//
// On a CUDA device (spec decode_attention.md §6) every per-token scalar a kernel reads (write_at
// offsets, FlashDecode's k_len, SymValue values) lives in one device "step scalars" buffer, filled
// by a single async copy from pinned host memory before the step runs, and everything runs on the
// device's one shared session stream (cuda::shared_stream: kernels with module-owned workspaces
// must not overlap across sessions). With `cuda_graph` on, each distinct arm-choice vector is
// first run eagerly once (warm-up: workspaces, cuBLASLt handles; its scratch tensors all held to
// the step's end, so the capture finds each block it needs cached), then captured once as a CUDA
// graph and replayed on every later step with that choice; a graph reads its inputs from
// session-owned device buffers, which each step fills by a copy (or the caller fills through
// input_buffer), while eager steps read the caller's tensors in place. Capture is refused when a
// scheduled node would freeze a host-resolved symbol into a launch (a shape or a slice bound that
// reads a symbol) or cannot run on the session's stream; the refusal names the node and the
// symbol, is an UnsupportedError with `require_cuda_graph`, and otherwise leaves that choice
// running eagerly (cuda_graph_status() says why). Shadow-check steps always run eagerly.
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
  // CUDA only: capture each arm choice's step once as a CUDA graph and replay it (when the step is
  // capturable); `require_cuda_graph` turns a refused capture into an UnsupportedError.
  bool cuda_graph = true;
  bool require_cuda_graph = false;
  // Optional work appended to every step after its schedule, given the step's outputs
  // (name -> value, views valid until the next step). It runs on the step's device, on CUDA inside
  // the session's stream scope (cuda::current_stream()), so a captured step records its launches
  // into the graph and every replay repeats them without calling it again: it must be
  // capturable (launches and async device work only, no synchronization, no host reads) and
  // launch the same work every step. The decode loop's greedy path (model/generate.h) writes the
  // argmax of the logits into the "tokens" input buffer here.
  std::function<void(const std::map<std::string, Tensor>& outputs)> epilogue;
  // What the session is, for SPLICE_DEBUG's log (core/debug.h): a named session prints its plan
  // summary from level 1, an unnamed one (the tuner's per-arm regions) from level 2.
  std::string name;
};

struct StepTiming {
  double total_us = 0;   // the whole step() call
  double kernel_us = 0;  // inside kernel calls (with measure_host_overhead)
  double host_us() const { return total_us - kernel_us; }
};

struct ShadowEvent {
  std::int64_t step = 0;
  NodeId branch;
  int arm = 0;                // the arm that was checked
  std::int64_t selector = 0;  // its bound value
  CompareReport report;
  bool demoted = false;
};

// One compute node's time in a profiled step (Session::set_profile_nodes).
struct NodeTime {
  NodeId node;
  double us = 0;
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
  // CUDA: whether the last step ran as a CUDA graph launch (the step that captures a graph
  // launches it too); false for eager steps (warm-up, refused choices, shadow checks, the CPU).
  bool last_step_replayed() const { return last_replayed_; }
  // CUDA: the session-owned device buffer a captured step reads input `name` from, viewed at
  // its shape under `symbols`. A caller that writes the input there and passes this very tensor
  // to step() saves the per-step copy (large inputs, e.g. the caches of a tuning region).
  Tensor input_buffer(const std::string& name, const SymBindings& symbols = {}) const;
  // One line per arm choice seen so far: "arms [1, 1]: captured" / "...: eager (reason)".
  std::string cuda_graph_status() const;
  // Per-node profile. While on, each step also times every compute node it runs, in schedule
  // order, into last_node_times() (empty after an unprofiled step). On the CPU: each node's wall
  // time. On CUDA a profiled step runs eagerly (its arm choice's graph is left as it is) behind a
  // hold_stream long enough for the host to enqueue the whole step, with a timing event either
  // side of each node, and waits for the device at its end: a node's time is its launches'
  // device time back to back, without the PDL overlap of a replayed step, so the sum exceeds a
  // replayed step's time. The hold lasts twice the previous profiled step's enqueue time (at
  // least 1 ms; 20 ms the first time).
  void set_profile_nodes(bool on);
  const std::vector<NodeTime>& last_node_times() const { return node_times_; }
  // CUDA: the last profiled step's device span, from its first node's start to its last node's
  // end (the nodes back to back, the gaps between them included; 0 when it ran no node): what
  // arm selection times on the GPU. The CPU: the sum of last_node_times().
  double last_profile_span_us() const { return profile_span_us_; }

 private:
  struct Impl;
  void run_nodes(const std::vector<int>& key, const std::vector<bool>& run, const TensorMap& inputs,
                 double& kernel_us);
  void execute_cuda(const std::vector<int>& key, const std::vector<bool>& run,
                    const TensorMap& inputs, double& kernel_us);
  Graph graph_;
  SessionOptions options_;
  Plan plan_;
  std::unique_ptr<Impl> impl_;
  std::int64_t steps_ = 0;
  std::vector<ShadowEvent> shadow_events_;
  std::vector<int> choices_;
  StepTiming timing_;
  bool last_replayed_ = false;
  std::vector<NodeTime> node_times_;
  double profile_span_us_ = 0;
};

// The arm a branch's dispatch table picks for `selector` (arm 0 outside every bucket).
int dispatch_arm(const BranchAttrs& branch, std::int64_t selector);

// Why a step that runs the nodes marked in `run` ([node index]; empty = every scheduled node)
// cannot be captured as one CUDA graph, naming the first offending node and the symbol it would
// freeze; "" when it can. Host-only: usable without a GPU.
std::string cuda_graph_refusal(const Graph& graph, const Plan& plan,
                               const std::vector<bool>& run = {});

}  // namespace splice
