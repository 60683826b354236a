// Session: plan once, step per token (see session.h for the stages of a step).
//
// CUDA execution of a step (after stages 1-3 of session.h, which never touch the device):
//   a. stage 2 wrote every per-token scalar into its slot of a pinned host buffer (after waiting
//      for the previous step's copy out of it);
//   b. on the session's stream: one async copy of that buffer into the device step-scalar
//      buffer, then each input into its session-owned device buffer;
//   c. the arm choice's state machine: new -> (refused: eager for good) | warm-up (eager) ->
//      capture (run the nodes under stream capture, instantiate, launch) -> replay (launch).
//      The warm-up keeps every scratch tensor it takes until its capture, which releases them
//      and so finds one cached block for each scratch request (cudaMalloc is refused while a
//      stream captures); a captured graph keeps its scratch for good.
// Reshape nodes are views of their input whenever the strides allow one (Tensor::view_reshape),
// strided inputs included; the planner counts a reshape as an alias of its input.
// The graph's launches read offsets and lengths from the step-scalar buffer, inputs from the
// staged buffers and write the same arena, so a replay computes this step's values.
#include "splice/exec/session.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <iostream>
#include <optional>
#include <sstream>

#include "exec/node_kernels.h"
#include "splice/backend/cpu/primitives.h"
#include "splice/core/debug.h"
#include "splice/core/error.h"

#ifdef SPLICE_WITH_CUDA
#include "splice/backend/cuda/primitives.h"
#include "splice/backend/cuda/runtime.h"
#endif

namespace splice {

namespace {

constexpr std::size_t kScalarSlotBytes = 8;  // one i64 (or i32) per slot

std::string symbol_names(const Graph& graph, const std::vector<SymExpr>& exprs) {
  std::vector<SymId> ids;
  for (const SymExpr& e : exprs) e.collect_symbols(ids);
  std::string out;
  std::vector<std::uint32_t> seen;
  for (SymId id : ids) {
    if (std::find(seen.begin(), seen.end(), id.id) != seen.end()) continue;
    seen.push_back(id.id);
    out += (out.empty() ? "`" : ", `") + graph.symbols().info(id).name + "`";
  }
  return out;
}

// Slice `id`'s bounds under `env` (its input of shape `input_shape`), checked against the axis.
void resolve_slice(const Graph& graph, NodeId id, const Dims& input_shape, const SymEnv& env,
                   std::int64_t& start, std::int64_t& end) {
  const Node& n = graph.node(id);
  start = n.attrs.start.eval(env);
  end = n.attrs.end.eval(env);
  const std::int64_t dim = input_shape[static_cast<std::size_t>(
      n.attrs.axis < 0 ? n.attrs.axis + static_cast<std::int64_t>(n.shape.size()) : n.attrs.axis)];
  if (start < 0 || end < start || end > dim)
    fail<ValueError>("step: slice %", id.index, " [", start, ", ", end,
                     ") is outside its axis of size ", dim, " (", n.label, ")");
}

std::string node_name(const Graph& graph, NodeId id) {
  const Node& n = graph.node(id);
  std::ostringstream out;
  out << "node %" << id.index << " (" << op_name(n.op);
  if (!n.label.empty()) out << " `" << n.label << "`";
  out << ")";
  return out.str();
}

}  // namespace

std::string cuda_graph_refusal(const Graph& graph, const Plan& plan, const std::vector<bool>& run) {
  const std::string head = "cannot capture this step as one CUDA graph: ";
  const std::string tail =
      "; a captured graph would freeze the value of its first step (spec decode_attention.md "
      "§6). Collapse the branch to an arm whose shapes are static, or run without "
      "require_cuda_graph";
  for (NodeId id : plan.schedule) {
    if (!run.empty() && !run[id.index]) continue;
    const Node& n = graph.node(id);
    if (!plan.static_shape[id.index])
      return head + node_name(graph, id) + " has shape " +
             sym_shape_str(n.shape, &graph.symbols()) + ", which depends on symbol " +
             symbol_names(graph, n.shape) + tail;
    if (n.op == Op::Slice && (!n.attrs.start.is_concrete() || !n.attrs.end.is_concrete()))
      return head + node_name(graph, id) + " has a slice bound [" +
             n.attrs.start.str(&graph.symbols()) + ", " + n.attrs.end.str(&graph.symbols()) +
             ") evaluated on the host from symbol " +
             symbol_names(graph, {n.attrs.start.expr(), n.attrs.end.expr()}) + tail;
    if (n.op == Op::SymValue && !n.attrs.value.is_concrete() && n.dtype != DType::i32 &&
        n.dtype != DType::i64)
      return head + node_name(graph, id) + " writes the value of symbol " +
             symbol_names(graph, {n.attrs.value.expr()}) + " as " + dtype_name(n.dtype) +
             ", which has no device step-scalar slot (only i32/i64 do)" + tail;
  }
  return "";
}

int dispatch_arm(const BranchAttrs& branch, std::int64_t selector) {
  for (const auto& c : branch.dispatch)
    if (selector >= c.lo && selector <= c.hi) return c.arm;
  return 0;
}

struct Session::Impl {
  std::shared_ptr<Storage> arena;
  std::vector<Tensor> values;             // [node] -> this step's value
  std::vector<Tensor> persistent;         // [node] -> state / param / constant tensors
  std::vector<Tensor> aux;                // [node] -> node-owned scalar buffers
  std::vector<Tensor> arena_views;        // [node] -> output view of a static-shape compute node
  std::vector<std::vector<Tensor>> args;  // [node] -> its inputs for this step (storage reused)
  std::vector<Dims> shapes;               // [node] -> this step's concrete shape
  std::vector<NodeScalars> scalars;       // [node] -> this step's evaluated scalar
  std::vector<NodeHints> hints;           // [node] -> plan-time kernel hints (node_kernels.h)
  std::vector<std::int64_t> slice_start, slice_end;
  std::vector<std::int64_t> selectors;                      // [branch region] -> selector value
  std::map<std::vector<int>, std::vector<bool>> run_masks;  // choices -> nodes to run
  // Nodes stage 2 must visit every step: a symbolic shape, or an op whose per-step scalar or
  // input check depends on the bindings. Everything else was evaluated once at construction.
  std::vector<NodeId> per_step;
  std::vector<NodeId> inputs;  // the Input nodes, in schedule order

  // ---- CUDA execution state (unused on the CPU) ----
  bool cuda = false;
  std::shared_ptr<Storage> scalar_storage;  // device step scalars, kScalarSlotBytes a slot
  unsigned char* scalar_host = nullptr;     // pinned staging for them
  std::size_t scalar_bytes = 0;
  std::vector<std::int64_t> scalar_slot;  // [node] -> byte offset of its slot, -1 if none
  std::vector<Tensor> input_stage;        // [node] -> device buffer of an Input (upper bound)
  bool use_input_stage = false;           // this step's Inputs read input_stage
  enum class Mode { fresh, eager, warm, replay };
  struct Replay {
    Mode mode = Mode::fresh;
    std::string reason;                // why an eager choice is not captured
    void* exec = nullptr;              // cuda::GraphExec
    std::vector<Tensor> scratch;       // kept alive for the graph's launches
    std::vector<Tensor> warm_scratch;  // the warm-up's scratch, held until the capture
    std::vector<std::pair<std::size_t, Tensor>> outputs;  // output node -> its value
  };
  std::map<std::vector<int>, Replay> replays;  // arm choice -> graph state
  void* stream = nullptr;                      // cuda::Stream: the device's shared stream
  void* scalars_copied = nullptr;              // cuda::Event: the pinned buffer may be rewritten

  // ---- per-node profile (set_profile_nodes) ----
  bool profile = false;
  std::vector<void*> profile_events;  // cuda::Event timing events, two a node, reused
  double profile_hold_us = 20000;     // CUDA: hold_stream before a profiled step

  void write_scalar(std::size_t node, DType dtype, std::int64_t value) {
    if (!cuda || scalar_slot[node] < 0) return;
    unsigned char* slot = scalar_host + scalar_slot[node];
    if (dtype == DType::i32) {
      const auto v = static_cast<std::int32_t>(value);
      std::memcpy(slot, &v, sizeof v);
    } else {
      std::memcpy(slot, &value, sizeof value);
    }
  }
  ~Impl();
};

Session::Impl::~Impl() {
#ifdef SPLICE_WITH_CUDA
  if (!cuda) return;
  try {
    cuda::stream_synchronize(static_cast<cuda::Stream>(stream));
  } catch (const Error&) {  // a destructor reports nothing; the context may already be broken
  }
  for (auto& [key, r] : replays) cuda::destroy_graph(static_cast<cuda::GraphExec>(r.exec));
  for (void* e : profile_events) cuda::destroy_event(static_cast<cuda::Event>(e));
  cuda::destroy_event(static_cast<cuda::Event>(scalars_copied));
  cuda::free_pinned(scalar_host);
#endif
}

Session::Session(Graph graph, SessionOptions options)
    : graph_(std::move(graph)), options_(std::move(options)), impl_(std::make_unique<Impl>()) {
  verify_graph(graph_);
#ifdef SPLICE_WITH_CUDA
  if (options_.device.is_cuda()) cuda::ensure_registered();
#endif
  plan_ = make_plan(graph_);
  if (debug_level() >= (options_.name.empty() ? 2 : 1))
    std::cerr << "[splice] " << (options_.name.empty() ? "session" : options_.name) << " "
              << plan_.summary(graph_) << "\n";
  const std::size_t count = graph_.size();
  Impl& im = *impl_;
  im.values.resize(count);
  im.persistent.resize(count);
  im.aux.resize(count);
  im.arena_views.resize(count);
  im.args.resize(count);
  im.shapes.resize(count);
  im.scalars.resize(count);
  im.hints.resize(count);
  im.slice_start.assign(count, 0);
  im.slice_end.assign(count, 0);
  const Device dev = options_.device;
  im.arena =
      Tensor::empty({std::max<std::int64_t>(plan_.arena_bytes / 4, 1)}, DType::f32, dev).storage();
  const SymEnv no_bindings(graph_.symbols());  // static shapes and constant bounds read no symbol
  for (NodeId id : plan_.schedule) {
    const Node& n = graph_.node(id);
    if (n.op == Op::State) {
      Tensor t = Tensor::zeros(upper_bound_shape(n.shape, graph_.symbols()), n.dtype, dev);
      im.persistent[id.index] = t;
    } else if (n.op == Op::Param || n.op == Op::Constant) {
      im.persistent[id.index] =
          n.attrs.tensor.device() == dev ? n.attrs.tensor : n.attrs.tensor.to_device(dev);
    }
    im.hints[id.index] = node_hints(graph_, id, dev);
    if (plan_.static_shape[id.index]) im.shapes[id.index] = eval_shape(n.shape, no_bindings);
    // A slice with constant bounds over a static shape (a projection's head or q|k|v view) is
    // resolved once, here; one whose bounds or input shape follow the step's bindings, each step.
    const bool static_slice = n.op == Op::Slice && n.attrs.start.is_concrete() &&
                              n.attrs.end.is_concrete() && plan_.static_shape[n.inputs[0].index];
    if (static_slice)
      resolve_slice(graph_, id, im.shapes[n.inputs[0].index], no_bindings, im.slice_start[id.index],
                    im.slice_end[id.index]);
    const bool binds = n.op == Op::Input || (n.op == Op::Slice && !static_slice) ||
                       n.op == Op::WriteAt || n.op == Op::SymValue || n.op == Op::FlashDecode;
    if (binds || !plan_.static_shape[id.index]) im.per_step.push_back(id);
    if (n.op == Op::Input) im.inputs.push_back(id);
  }
  choices_.assign(plan_.branches.size(), 0);
  im.selectors.assign(plan_.branches.size(), 0);
  if (!dev.is_cuda()) return;
#ifdef SPLICE_WITH_CUDA
  // Step scalars: one slot per node whose kernel reads a per-token scalar; inputs: staged.
  im.cuda = true;
  im.scalar_slot.assign(count, -1);
  im.input_stage.resize(count);
  std::vector<std::pair<std::size_t, DType>> slots;
  for (NodeId id : plan_.schedule) {
    const Node& n = graph_.node(id);
    DType dtype = DType::i64;
    if (n.op == Op::FlashDecode) dtype = DType::i32;
    if (n.op == Op::SymValue) dtype = n.dtype;
    if (n.op == Op::FlashDecode || n.op == Op::WriteAt ||
        (n.op == Op::SymValue && (n.dtype == DType::i32 || n.dtype == DType::i64))) {
      im.scalar_slot[id.index] = static_cast<std::int64_t>(slots.size() * kScalarSlotBytes);
      slots.push_back({id.index, dtype});
    }
    if (n.op == Op::Input)
      im.input_stage[id.index] =
          Tensor::empty(upper_bound_shape(n.shape, graph_.symbols()), n.dtype, dev);
  }
  im.scalar_bytes = std::max<std::size_t>(slots.size(), 1) * kScalarSlotBytes;
  const auto scalar_elems = static_cast<std::int64_t>(im.scalar_bytes / kScalarSlotBytes);
  im.scalar_storage = Tensor::zeros({scalar_elems}, DType::i64, dev).storage();
  im.scalar_host = static_cast<unsigned char*>(cuda::alloc_pinned(im.scalar_bytes));
  std::memset(im.scalar_host, 0, im.scalar_bytes);
  for (const auto& [node, dtype] : slots) {
    const auto elem = static_cast<std::int64_t>(dtype_size(dtype));
    im.scalars[node].device =
        Tensor::view_of(im.scalar_storage, im.scalar_slot[node] / elem, {1}, {1}, dtype);
  }
  im.stream = cuda::shared_stream(dev.index);
  im.scalars_copied = cuda::create_event();
#else
  fail<DeviceError>("Session: ", dev.str(), " needs the CUDA backend, absent from this build");
#endif
}

Session::~Session() = default;

void Session::reset_states() {
  for (NodeId id : plan_.schedule)
    if (graph_.node(id).op == Op::State) {
      Tensor& t = impl_->persistent[id.index];
      Tensor zero = Tensor::zeros(t.shape(), t.dtype(), t.device());
      t.copy_from(zero);
    }
}

Tensor Session::output(const std::string& name) const {
  for (const auto& [n, id] : graph_.outputs())
    if (n == name) {
      if (steps_ == 0) fail<ValueError>("output '", name, "' is read before the first step");
      return impl_->values[id.index];
    }
  fail<ValueError>("no output named '", name, "'");
}

Tensor Session::state(const std::string& name) const {
  for (NodeId id : plan_.schedule) {
    const Node& n = graph_.node(id);
    if (n.op == Op::State && n.attrs.name == name) return impl_->persistent[id.index];
  }
  fail<ValueError>("no state named '", name, "'");
}

namespace {

Tensor arena_view(const std::shared_ptr<Storage>& arena, std::int64_t offset_bytes,
                  const Dims& shape, DType dtype) {
  return Tensor::view_of(arena, offset_bytes / static_cast<std::int64_t>(dtype_size(dtype)), shape,
                         Tensor::contiguous_strides(shape), dtype);
}

}  // namespace

void Session::step(const SymBindings& symbols, const TensorMap& inputs) {
  Impl& im = *impl_;
  const SymTable& table = graph_.symbols();
  using Clock = std::chrono::steady_clock;
  const auto step_start = Clock::now();
  double kernel_us = 0;

  // Stage 1: bind.
  SymEnv env(table);
  for (const auto& [name, value] : symbols) env.bind(name, value);

    // Stage 2: check inputs and evaluate every symbolic shape and per-step scalar (im.per_step)
    // before anything runs.
#ifdef SPLICE_WITH_CUDA
  // The previous step's copy out of the pinned scalar buffer must be done before it is rewritten.
  if (im.cuda) cuda::event_synchronize(static_cast<cuda::Event>(im.scalars_copied));
#endif
  std::size_t matched_inputs = 0;
  for (NodeId id : im.per_step) {
    const Node& n = graph_.node(id);
    if (!plan_.static_shape[id.index]) im.shapes[id.index] = eval_shape(n.shape, env);
    const Dims& shape = im.shapes[id.index];
    switch (n.op) {
      case Op::Input: {
        auto it = inputs.find(n.attrs.name);
        if (it == inputs.end()) fail<ValueError>("step: input '", n.attrs.name, "' was not given");
        const Tensor& t = it->second;
        if (t.dtype() != n.dtype)
          fail<DTypeError>("step: input `", n.attrs.name, "` must be ", dtype_name(n.dtype),
                           ", got ", dtype_name(t.dtype()));
        if (t.shape() != shape)
          fail<ShapeError>("step: input `", n.attrs.name, "` must have shape ", dims_str(shape),
                           " under this step's bindings, got ", dims_str(t.shape()));
        if (!(t.device() == options_.device))
          fail<DeviceError>("step: input `", n.attrs.name, "` must be on ", options_.device.str(),
                            ", got ", t.device().str());
        ++matched_inputs;
        break;
      }
      case Op::Slice:
        resolve_slice(graph_, id, im.shapes[n.inputs[0].index], env, im.slice_start[id.index],
                      im.slice_end[id.index]);
        break;
      case Op::WriteAt: {
        const std::int64_t offset = n.attrs.offset.eval(env);
        const std::size_t axis = static_cast<std::size_t>(
            n.attrs.axis < 0 ? n.attrs.axis + static_cast<std::int64_t>(n.shape.size())
                             : n.attrs.axis);
        const std::int64_t rows = im.shapes[n.inputs[1].index][axis];
        const std::int64_t cap = shape[axis];
        if (offset < 0 || offset + rows > cap)
          fail<ValueError>("step: write_at %", id.index, " writes rows [", offset, ", ",
                           offset + rows, ") of a state axis of size ", cap, " (", n.label, ")");
        im.scalars[id.index].value = offset;
        im.write_scalar(id.index, DType::i64, offset);
        break;
      }
      case Op::SymValue:
        im.scalars[id.index].value = n.attrs.value.eval(env);
        im.write_scalar(id.index, n.dtype, im.scalars[id.index].value);
        break;
      case Op::FlashDecode: {
        const std::int64_t k_len = n.attrs.flash->k_len.eval(env);
        const std::int64_t cap = im.shapes[n.inputs[1].index][2];
        if (k_len < 0 || k_len > cap)
          fail<ValueError>("step: flash_decode %", id.index, " k_len = ", k_len, " is outside [0, ",
                           cap, "]");
        im.scalars[id.index].value = k_len;
        im.write_scalar(id.index, DType::i32, k_len);
        break;
      }
      default:
        break;
    }
  }
  if (matched_inputs != inputs.size())
    for (const auto& [name, t] : inputs) {
      bool known = false;
      for (NodeId id : im.inputs) known |= graph_.node(id).attrs.name == name;
      if (!known) fail<ValueError>("step: '", name, "' is not an input of this graph");
    }

  // Stage 3: choose arms, then find which nodes run.
  const bool shadow_step = options_.shadow_every > 0 && (steps_ + 1) % options_.shadow_every == 0;
  std::vector<int> key(plan_.branches.size() * 2, 0);
  for (std::size_t b = 0; b < plan_.branches.size(); ++b) {
    const BranchRegion& region = plan_.branches[b];
    const BranchAttrs& attrs = *graph_.node(region.branch).attrs.branch;
    im.selectors[b] = attrs.recipe.selector ? attrs.recipe.selector->eval(env) : 0;
    const int arm = dispatch_arm(attrs, im.selectors[b]);
    choices_[b] = arm;
    key[2 * b] = arm;
    key[2 * b + 1] = shadow_step && arm != 0 && !region.arms_have_effects;  // also run arm 0
  }
  auto mask_it = im.run_masks.find(key);
  if (mask_it == im.run_masks.end()) {
    std::vector<bool> run = nodes_to_run(graph_, plan_, key);
    mask_it = im.run_masks.emplace(key, std::move(run)).first;
  }
  const std::vector<bool>& run = mask_it->second;

  // Stage 4: execute (on CUDA: decide eager / capture / replay for this arm choice first).
  last_replayed_ = false;
  node_times_.clear();
  profile_span_us_ = 0;
  if (im.cuda) {
    execute_cuda(key, run, inputs, kernel_us);
  } else {
    run_nodes(key, run, inputs, kernel_us);
    for (const NodeTime& t : node_times_) profile_span_us_ += t.us;
  }
  ++steps_;
  timing_.total_us = std::chrono::duration<double, std::micro>(Clock::now() - step_start).count();
  timing_.kernel_us = kernel_us;
}

void Session::run_nodes(const std::vector<int>& key, const std::vector<bool>& run,
                        const TensorMap& inputs, double& kernel_us) {
  Impl& im = *impl_;
  using Clock = std::chrono::steady_clock;
  for (NodeId id : plan_.schedule) {
    if (!run[id.index]) continue;
    const Node& n = graph_.node(id);
    Tensor& value = im.values[id.index];
    const Dims& shape = im.shapes[id.index];
    switch (n.op) {
      case Op::Input:  // on CUDA: the session-owned buffer the input was copied into
        value = im.use_input_stage ? Tensor::view_of(im.input_stage[id.index].storage(), 0, shape,
                                                     Tensor::contiguous_strides(shape), n.dtype)
                                   : inputs.at(n.attrs.name);
        continue;
      case Op::Param:
      case Op::Constant:
        value = im.persistent[id.index];
        continue;
      case Op::State: {
        const Tensor& t = im.persistent[id.index];
        value = t.shape() == shape
                    ? t
                    : Tensor::view_of(t.storage(), t.offset(), shape, t.strides(), t.dtype());
        continue;
      }
      case Op::Permute:
        value = im.values[n.inputs[0].index].permute(n.attrs.perm);
        continue;
      case Op::Slice:
        value = im.values[n.inputs[0].index].slice(n.attrs.axis, im.slice_start[id.index],
                                                   im.slice_end[id.index]);
        continue;
      case Op::Sequence:
      case Op::StateAfter:
        value = im.values[n.inputs[0].index];
        continue;
      case Op::WriteAt: {
        Tensor state = im.values[n.inputs[0].index];
        run_write_at(n, state, im.values[n.inputs[1].index], im.scalars[id.index]);
        value = state;
        continue;
      }
      case Op::SymValue:
        if (im.scalars[id.index].device.defined()) {  // CUDA: the step-scalar slot itself
          value = im.scalars[id.index].device;
          continue;
        }
        break;
      case Op::Branch: {
        std::size_t b = 0;
        while (plan_.branches[b].branch != id) ++b;
        const int arm = choices_[b];
        value = im.values[n.inputs[arm].index];
        if (key[2 * b + 1]) {
          const Tensor& oracle = im.values[n.inputs[0].index];
          const Tolerance tol = options_.shadow_tolerance ? options_.shadow_tolerance(graph_, id)
                                                          : default_tolerance(n.dtype);
          ShadowEvent event;
          event.step = steps_;
          event.branch = id;
          event.arm = arm;
          event.selector = im.selectors[b];
          event.report = compare_tensors(
              value.device().is_cpu() ? value : value.to_device(Device::cpu()),
              oracle.device().is_cpu() ? oracle : oracle.to_device(Device::cpu()), tol);
          if (!event.report.ok) {
            // Demote: the bucket holding this selector value runs the oracle from now on.
            auto& dispatch = graph_.mutable_node(id).attrs.branch->dispatch;
            for (auto& c : dispatch)
              if (event.selector >= c.lo && event.selector <= c.hi) c.arm = 0;
            event.demoted = true;
            value = oracle;
          }
          shadow_events_.push_back(event);
        }
        continue;
      }
      case Op::Reshape: {
        const Tensor& src = im.values[n.inputs[0].index];
        if (src.is_contiguous()) {
          value = src.reshape(shape);
          continue;
        }
        // A strided input (e.g. a column slice of a batch's stacked projections) whose new shape
        // only splits or merges dims that are contiguous with each other is a view too; the
        // planner already counts a reshape as an alias of its input.
        if (std::optional<Tensor> view = src.view_reshape(shape)) {
          value = std::move(*view);
          continue;
        }
        break;
      }
      default:
        break;
    }
    // The output's arena view: built once for a static shape (the planned buffer never moves).
    if (plan_.static_shape[id.index]) {
      Tensor& view = im.arena_views[id.index];
      if (!view.defined())
        view = arena_view(im.arena, plan_.buffer_offset[id.index], shape, n.dtype);
      value = view;
    } else {
      value = arena_view(im.arena, plan_.buffer_offset[id.index], shape, n.dtype);
    }
    // The inputs, copied into the node's own argument vector: after the first step each copy
    // reuses its shape and stride storage (no allocation per node and step).
    std::vector<Tensor>& args = im.args[id.index];
    args.resize(n.inputs.size());
    for (std::size_t i = 0; i < n.inputs.size(); ++i) args[i] = im.values[n.inputs[i].index];
    if (options_.measure_host_overhead || im.profile) {
      [[maybe_unused]] const std::size_t mark = 2 * node_times_.size();  // CUDA: its two events
#ifdef SPLICE_WITH_CUDA
      if (im.profile && im.cuda) {
        while (im.profile_events.size() < mark + 2)
          im.profile_events.push_back(cuda::create_timing_event());
        cuda::record_event(static_cast<cuda::Event>(im.profile_events[mark]),
                           static_cast<cuda::Stream>(im.stream));
      }
#endif
      const auto k0 = Clock::now();
      run_compute_node(n, args, value, im.scalars[id.index], im.aux[id.index], im.hints[id.index]);
      const double us = std::chrono::duration<double, std::micro>(Clock::now() - k0).count();
#ifdef SPLICE_WITH_CUDA
      if (im.profile && im.cuda)
        cuda::record_event(static_cast<cuda::Event>(im.profile_events[mark + 1]),
                           static_cast<cuda::Stream>(im.stream));
#endif
      if (options_.measure_host_overhead) kernel_us += us;
      if (im.profile) node_times_.push_back({id, im.cuda ? 0.0 : us});  // CUDA: filled at the end
    } else {
      run_compute_node(n, args, value, im.scalars[id.index], im.aux[id.index], im.hints[id.index]);
    }
  }
  if (options_.epilogue) {
    TensorMap outputs;
    for (const auto& [name, id] : graph_.outputs()) outputs.emplace(name, im.values[id.index]);
    const auto e0 = Clock::now();
    options_.epilogue(outputs);
    if (options_.measure_host_overhead)
      kernel_us += std::chrono::duration<double, std::micro>(Clock::now() - e0).count();
  }
}

#ifdef SPLICE_WITH_CUDA
namespace {
// cuda::retain_scratch(sink) for a scope: every scratch tensor the scope's primitives allocate is
// also kept in `sink`; cleared when the scope ends, by a throw too.
class ScratchSink {
 public:
  explicit ScratchSink(std::vector<Tensor>* sink) { cuda::retain_scratch(sink); }
  ~ScratchSink() { cuda::retain_scratch(nullptr); }
  ScratchSink(const ScratchSink&) = delete;
  ScratchSink& operator=(const ScratchSink&) = delete;
};
}  // namespace
#endif

void Session::execute_cuda(const std::vector<int>& key, const std::vector<bool>& run,
                           const TensorMap& inputs, double& kernel_us) {
#ifdef SPLICE_WITH_CUDA
  Impl& im = *impl_;
  const auto stream = static_cast<cuda::Stream>(im.stream);
  bool shadow = false;
  for (std::size_t b = 0; b < plan_.branches.size(); ++b) shadow |= key[2 * b + 1] != 0;

  // The arm choice's graph state; a refusal is decided before anything runs. A shadow step
  // compares on the host, so it runs eagerly by design.
  Impl::Replay* replay = nullptr;
  bool warm_up = false;
  if (options_.cuda_graph && !shadow && !im.profile) {
    replay = &im.replays[key];
    if (replay->mode == Impl::Mode::fresh) {
      const std::string reason = cuda_graph_refusal(graph_, plan_, run);
      if (!reason.empty()) {
        if (options_.require_cuda_graph) {
          im.replays.erase(key);
          fail<UnsupportedError>("step: ", reason);
        }
        replay->mode = Impl::Mode::eager;
        replay->reason = reason;
      } else {
        warm_up = true;
      }
    }
  }

  cuda::StreamGuard guard(stream);
  // Step scalars, then (graph mode only) inputs, into their device buffers. An eager choice reads
  // the caller's input tensors in place; a graph reads the session's buffers, skipping the copy
  // when the caller filled the buffer itself (input_buffer).
  cuda::copy_async(im.scalar_storage->data, im.scalar_host, im.scalar_bytes, stream);
  cuda::record_event(static_cast<cuda::Event>(im.scalars_copied), stream);
  im.use_input_stage = replay && replay->mode != Impl::Mode::eager;
  for (NodeId id : im.inputs) {
    const Node& n = graph_.node(id);
    if (!im.use_input_stage || !run[id.index]) continue;
    const Tensor& given = inputs.at(n.attrs.name);
    const Dims& shape = im.shapes[id.index];
    Tensor staged = Tensor::view_of(im.input_stage[id.index].storage(), 0, shape,
                                    Tensor::contiguous_strides(shape), n.dtype);
    if (given.raw_data() == staged.raw_data() && given.strides() == staged.strides()) continue;
    if (given.is_contiguous())
      cuda::copy_async(staged.raw_data(), given.raw_data(), given.nbytes(), stream);
    else
      cuda::cast(given, staged);
  }

  if (im.profile) {
    // Profiled (set_profile_nodes): eager, behind a hold so the device runs the nodes back to
    // back, then each node's events read once the device is done.
    cuda::hold_stream(im.profile_hold_us);
    const auto enqueue0 = std::chrono::steady_clock::now();
    run_nodes(key, run, inputs, kernel_us);
    const double enqueue_us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - enqueue0)
            .count();
    cuda::stream_synchronize(stream);
    for (std::size_t i = 0; i < node_times_.size(); ++i)
      node_times_[i].us = cuda::elapsed_us(static_cast<cuda::Event>(im.profile_events[2 * i]),
                                           static_cast<cuda::Event>(im.profile_events[2 * i + 1]));
    if (!node_times_.empty())
      profile_span_us_ =
          cuda::elapsed_us(static_cast<cuda::Event>(im.profile_events[0]),
                           static_cast<cuda::Event>(im.profile_events[2 * node_times_.size() - 1]));
    im.profile_hold_us = std::max(1000.0, 2 * enqueue_us);
    return;
  }
  if (!replay || replay->mode == Impl::Mode::eager || warm_up) {
    // The warm-up holds every scratch tensor it takes, as the capture will (a graph keeps its
    // scratch), and keeps them until this choice's capture: released just before it, they leave
    // the caching allocator one block for each the capture asks for, so it never calls
    // cudaMalloc, which a capturing stream refuses (a batched step's GEMMs each take an f32
    // product of the same size; eagerly they share one). Held until then, no other session's
    // capture in between can take them.
    std::optional<ScratchSink> hold;
    if (warm_up) hold.emplace(&replay->warm_scratch);
    run_nodes(key, run, inputs, kernel_us);
    if (warm_up) replay->mode = Impl::Mode::warm;  // captured the next time this choice runs
    return;
  }
  if (replay->mode == Impl::Mode::warm) {
    // Capture: the same launches as the eager run, recorded instead of executed.
    cuda::GraphExec exec = nullptr;
    std::vector<Tensor> scratch;
    replay->warm_scratch.clear();  // their blocks back to the cache, for the capture to take
    cuda::begin_capture(stream);
    try {
      double ignored = 0;
      {
        ScratchSink hold(&scratch);
        run_nodes(key, run, inputs, ignored);
      }
      exec = cuda::end_capture(stream);
    } catch (const Error& e) {
      cuda::abort_capture(stream);
      if (options_.require_cuda_graph) throw;
      replay->mode = Impl::Mode::eager;
      replay->reason = std::string("capture failed: ") + e.what();
      run_nodes(key, run, inputs, kernel_us);  // nothing ran: run this step eagerly
      return;
    }
    replay->exec = exec;
    replay->scratch = std::move(scratch);
    for (const auto& [name, id] : graph_.outputs())
      replay->outputs.push_back({id.index, im.values[id.index]});
    replay->mode = Impl::Mode::replay;
  } else {
    for (const auto& [node, value] : replay->outputs) im.values[node] = value;
  }
  cuda::launch_graph(static_cast<cuda::GraphExec>(replay->exec), stream);
  last_replayed_ = true;
#else
  (void)key;
  (void)run;
  (void)inputs;
  (void)kernel_us;
  fail<DeviceError>("Session: CUDA execution needs the CUDA backend, absent from this build");
#endif
}

void Session::set_profile_nodes(bool on) {
  impl_->profile = on;
  if (!on) node_times_.clear();
}

Tensor Session::input_buffer(const std::string& name, const SymBindings& symbols) const {
  for (NodeId id : plan_.schedule) {
    const Node& n = graph_.node(id);
    if (n.op != Op::Input || n.attrs.name != name) continue;
    if (!impl_->cuda)
      fail<DeviceError>("input_buffer: the session runs on ", device().str(),
                        ", which has no input buffers");
    SymEnv env(graph_.symbols());
    for (const auto& [sym, value] : symbols) env.bind(sym, value);
    const Dims shape = eval_shape(n.shape, env);
    return Tensor::view_of(impl_->input_stage[id.index].storage(), 0, shape,
                           Tensor::contiguous_strides(shape), n.dtype);
  }
  fail<ValueError>("input_buffer: '", name, "' is not an input of this graph");
}

std::string Session::cuda_graph_status() const {
  std::ostringstream out;
  for (const auto& [key, r] : impl_->replays) {
    out << "arms [";
    for (std::size_t b = 0; b < key.size(); b += 2) out << (b ? ", " : "") << key[b];
    out << "]: ";
    switch (r.mode) {
      case Impl::Mode::replay:
        out << "captured";
        break;
      case Impl::Mode::warm:
        out << "warmed up, captured on its next step";
        break;
      case Impl::Mode::eager:
        out << "eager (" << r.reason << ")";
        break;
      default:
        out << "new";
        break;
    }
    out << "\n";
  }
  return out.str();
}

}  // namespace splice
