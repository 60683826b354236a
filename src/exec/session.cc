// Session: plan once, step per token (see session.h for the stages of a step).
#include "splice/exec/session.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "exec/node_kernels.h"
#include "splice/backend/cpu/primitives.h"
#include "splice/core/error.h"

namespace splice {

int dispatch_arm(const BranchAttrs& branch, std::int64_t selector) {
  for (const auto& c : branch.dispatch)
    if (selector >= c.lo && selector <= c.hi) return c.arm;
  return 0;
}

struct Session::Impl {
  std::shared_ptr<Storage> arena;
  std::vector<Tensor> values;          // [node] -> this step's value
  std::vector<Tensor> persistent;      // [node] -> state / param / constant tensors
  std::vector<Tensor> aux;             // [node] -> node-owned scalar buffers
  std::vector<Dims> shapes;            // [node] -> this step's concrete shape
  std::vector<NodeScalars> scalars;    // [node] -> this step's evaluated scalar
  std::vector<std::int64_t> slice_start, slice_end;
  std::vector<std::int64_t> selectors; // [branch region] -> selector value
  std::map<std::vector<int>, std::vector<bool>> run_masks;  // choices -> nodes to run
};

Session::Session(Graph graph, SessionOptions options)
    : graph_(std::move(graph)), options_(std::move(options)), impl_(std::make_unique<Impl>()) {
  verify_graph(graph_);
  plan_ = make_plan(graph_);
  const std::size_t count = graph_.size();
  Impl& im = *impl_;
  im.values.resize(count);
  im.persistent.resize(count);
  im.aux.resize(count);
  im.shapes.resize(count);
  im.scalars.resize(count);
  im.slice_start.assign(count, 0);
  im.slice_end.assign(count, 0);
  const Device dev = options_.device;
  im.arena = Tensor::empty({std::max<std::int64_t>(plan_.arena_bytes / 4, 1)}, DType::f32, dev).storage();
  for (NodeId id : plan_.schedule) {
    const Node& n = graph_.node(id);
    if (n.op == Op::State) {
      Tensor t = Tensor::zeros(upper_bound_shape(n.shape, graph_.symbols()), n.dtype, dev);
      im.persistent[id.index] = t;
    } else if (n.op == Op::Param || n.op == Op::Constant) {
      im.persistent[id.index] =
          n.attrs.tensor.device() == dev ? n.attrs.tensor : n.attrs.tensor.to_device(dev);
    }
    if (plan_.static_shape[id.index]) im.shapes[id.index] = eval_shape(n.shape, SymEnv(graph_.symbols()));
  }
  choices_.assign(plan_.branches.size(), 0);
  im.selectors.assign(plan_.branches.size(), 0);
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

Tensor arena_view(const std::shared_ptr<Storage>& arena, std::int64_t offset_bytes, const Dims& shape,
                  DType dtype) {
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

  // Stage 2: check inputs and evaluate every shape and scalar before anything runs.
  std::size_t matched_inputs = 0;
  for (NodeId id : plan_.schedule) {
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
          fail<DeviceError>("step: input `", n.attrs.name, "` must be on ",
                            options_.device.str(), ", got ", t.device().str());
        ++matched_inputs;
        break;
      }
      case Op::Slice: {
        const std::int64_t start = n.attrs.start.eval(env), end = n.attrs.end.eval(env);
        const std::int64_t dim = im.shapes[n.inputs[0].index][static_cast<std::size_t>(
            n.attrs.axis < 0 ? n.attrs.axis + static_cast<std::int64_t>(n.shape.size()) : n.attrs.axis)];
        if (start < 0 || end < start || end > dim)
          fail<ValueError>("step: slice %", id.index, " [", start, ", ", end,
                           ") is outside its axis of size ", dim, " (", n.label, ")");
        im.slice_start[id.index] = start;
        im.slice_end[id.index] = end;
        break;
      }
      case Op::WriteAt: {
        const std::int64_t offset = n.attrs.offset.eval(env);
        const std::size_t axis = static_cast<std::size_t>(
            n.attrs.axis < 0 ? n.attrs.axis + static_cast<std::int64_t>(n.shape.size()) : n.attrs.axis);
        const std::int64_t rows = im.shapes[n.inputs[1].index][axis];
        const std::int64_t cap = shape[axis];
        if (offset < 0 || offset + rows > cap)
          fail<ValueError>("step: write_at %", id.index, " writes rows [", offset, ", ",
                           offset + rows, ") of a state axis of size ", cap, " (", n.label, ")");
        im.scalars[id.index].value = offset;
        break;
      }
      case Op::SymValue: im.scalars[id.index].value = n.attrs.value.eval(env); break;
      case Op::FlashDecode: {
        const std::int64_t k_len = n.attrs.flash->k_len.eval(env);
        const std::int64_t cap = im.shapes[n.inputs[1].index][2];
        if (k_len < 0 || k_len > cap)
          fail<ValueError>("step: flash_decode %", id.index, " k_len = ", k_len,
                           " is outside [0, ", cap, "]");
        im.scalars[id.index].value = k_len;
        break;
      }
      default: break;
    }
  }
  if (matched_inputs != inputs.size())
    for (const auto& [name, t] : inputs) {
      bool known = false;
      for (NodeId id : plan_.schedule)
        known |= graph_.node(id).op == Op::Input && graph_.node(id).attrs.name == name;
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
    std::vector<bool> run(graph_.size(), true);
    for (std::size_t b = 0; b < plan_.branches.size(); ++b)
      for (std::size_t arm = 0; arm < plan_.branches[b].arm_nodes.size(); ++arm) {
        const bool keep = static_cast<int>(arm) == key[2 * b] || (arm == 0 && key[2 * b + 1]);
        if (keep) continue;
        const auto& nodes = plan_.branches[b].arm_nodes[arm];
        for (std::size_t i = 0; i < nodes.size(); ++i)
          if (nodes[i]) run[i] = false;
      }
    // A node needed by a kept arm stays even if another arm's region listed it.
    for (std::size_t b = 0; b < plan_.branches.size(); ++b)
      for (std::size_t arm = 0; arm < plan_.branches[b].arm_nodes.size(); ++arm)
        if (static_cast<int>(arm) == key[2 * b] || (arm == 0 && key[2 * b + 1])) {
          const auto& nodes = plan_.branches[b].arm_nodes[arm];
          for (std::size_t i = 0; i < nodes.size(); ++i)
            if (nodes[i]) run[i] = true;
        }
    mask_it = im.run_masks.emplace(key, std::move(run)).first;
  }
  const std::vector<bool>& run = mask_it->second;

  // Stage 4: execute.
  std::vector<Tensor> args;
  for (NodeId id : plan_.schedule) {
    if (!run[id.index]) continue;
    const Node& n = graph_.node(id);
    Tensor& value = im.values[id.index];
    const Dims& shape = im.shapes[id.index];
    switch (n.op) {
      case Op::Input: value = inputs.at(n.attrs.name); continue;
      case Op::Param:
      case Op::Constant: value = im.persistent[id.index]; continue;
      case Op::State: {
        const Tensor& t = im.persistent[id.index];
        value = t.shape() == shape ? t : Tensor::view_of(t.storage(), t.offset(), shape, t.strides(), t.dtype());
        continue;
      }
      case Op::Permute: value = im.values[n.inputs[0].index].permute(n.attrs.perm); continue;
      case Op::Slice:
        value = im.values[n.inputs[0].index].slice(n.attrs.axis, im.slice_start[id.index],
                                                   im.slice_end[id.index]);
        continue;
      case Op::Sequence: value = im.values[n.inputs[0].index]; continue;
      case Op::WriteAt: {
        Tensor state = im.values[n.inputs[0].index];
        if (state.device().is_cpu()) {
          cpu::write_at(state, im.values[n.inputs[1].index], n.attrs.axis, im.scalars[id.index].value);
        } else {
          Tensor window = state.slice(n.attrs.axis, im.scalars[id.index].value,
                                      im.scalars[id.index].value + im.values[n.inputs[1].index].size(n.attrs.axis));
          window.copy_from(im.values[n.inputs[1].index]);
        }
        value = state;
        continue;
      }
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
          event.report = compare_tensors(value.device().is_cpu() ? value : value.to_device(Device::cpu()),
                                         oracle.device().is_cpu() ? oracle : oracle.to_device(Device::cpu()),
                                         tol);
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
        break;
      }
      default: break;
    }
    value = arena_view(im.arena, plan_.buffer_offset[id.index], shape, n.dtype);
    args.clear();
    for (NodeId in : n.inputs) args.push_back(im.values[in.index]);
    if (options_.measure_host_overhead) {
      const auto k0 = Clock::now();
      run_compute_node(n, args, value, im.scalars[id.index], im.aux[id.index]);
      kernel_us += std::chrono::duration<double, std::micro>(Clock::now() - k0).count();
    } else {
      run_compute_node(n, args, value, im.scalars[id.index], im.aux[id.index]);
    }
  }
  ++steps_;
  timing_.total_us = std::chrono::duration<double, std::micro>(Clock::now() - step_start).count();
  timing_.kernel_us = kernel_us;
}

}  // namespace splice
