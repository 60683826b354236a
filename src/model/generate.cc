// The decode loop and the sampler (see generate.h).
//
// Greedy in the step (generate.h):
//   1. Construction: a Feedback holds `ids`, the [1] i32 buffer a continuing step reads as its
//      "tokens" input (on CUDA the session's own input buffer, so a graph replay reads it without
//      a staging copy; on the CPU a tensor the session reads in place) and, on CUDA, a pinned
//      int32 `mirror`. The session's epilogue writes argmax(logits) into both after every step
//      (cuda::argmax with a host mirror, recorded into the step's CUDA graph; cpu::argmax).
//   2. generate(): the prompt is uploaded once and fed as views of that upload (no wait between
//      prompt steps); the first pick is read after the last prompt step.
//   3. Each decode step feeds `ids` (the previous pick, already in place); reading a step's pick
//      waits for the event recorded after it, reads its mirror slot (step n: slot n % 2) and
//      poisons it with kNoChoice, so a read that no kernel wrote is an internal error instead of
//      a stale token.
//   4. Pipelined on CUDA (generate.h): the step computing token i + 1 is in flight while token i
//      is read and streamed; a stop token waits for that step and moves the position back.
#include "splice/model/generate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <numeric>
#include <optional>

#include "exec/node_kernels.h"
#include "splice/backend/cpu/sampling.h"
#include "splice/core/error.h"

#ifdef SPLICE_WITH_CUDA
#include "splice/backend/cuda/runtime.h"
#include "splice/backend/cuda/sampling.h"
#endif

namespace splice {

namespace {

constexpr std::int32_t kNoChoice = -1;  // the mirror's value until a kernel writes a pick
// Mirror slots: step n writes slot n % 2, so the host reads step n while step n + 1 runs.
constexpr int kMirrorSlots = 2;

// Whether a decode step launched past the end of the sequence (one token too many: the pipelined
// loop's step after a stop token) can be taken back by moving the position back: every state is
// a cache whose writers append at the step's own row, k_len - 1 (WriteAt offsets, RopeKvAppend
// and RmsNormMatMulRopeKvAppend positions), so the overrun only wrote a row past the live length,
// which the next step rewrites. A recurrent state (KDA) advanced by the overrun cannot be taken
// back.
bool overrun_is_harmless(const Graph& g) {
  const std::optional<SymId> k_len = g.symbols().find("k_len");
  if (!k_len) return false;
  const SymExpr last_row = SymExpr(*k_len) - SymExpr(1);
  for (NodeId id : g.live_nodes()) {
    const Node& n = g.node(id);
    switch (n.op) {
      case Op::WriteAt:
        if (!n.attrs.offset.expr().structurally_equal(last_row)) return false;
        break;
      case Op::RopeKvAppend:
      case Op::RmsNormMatMulRopeKvAppend: {  // their caches' row is the position input's value
        const Node& position = g.node(n.inputs[position_input(n.op)]);
        if (position.op != Op::SymValue ||
            !position.attrs.value.expr().structurally_equal(last_row))
          return false;
        break;
      }
      case Op::KdaDecode:
        return false;
      default:
        break;
    }
  }
  return true;
}

}  // namespace

void validate(const SamplingOptions& options) {
  if (!(options.temperature >= 0) || !std::isfinite(options.temperature))
    fail<ValueError>("temperature must be finite and >= 0, got ", options.temperature);
  if (options.top_k < 0) fail<ValueError>("top_k must be >= 0, got ", options.top_k);
  if (!(options.top_p > 0 && options.top_p <= 1))
    fail<ValueError>("top_p must be in (0, 1], got ", options.top_p);
}

void validate(const GenerateOptions& options) {
  if (options.max_new_tokens < 0)
    fail<ValueError>("max_new_tokens must be >= 0, got ", options.max_new_tokens);
  validate(options.sampling);
}

Sampler::Sampler(SamplingOptions options) : options_(options), rng_(options.seed) {
  validate(options_);
}

std::int32_t Sampler::sample(const Tensor& logits) {
  const std::int64_t vocab = logits.numel();
  const Tensor flat = logits.contiguous().to(DType::f32);
  const float* l = flat.data<float>();
  if (options_.temperature == 0.0f) return static_cast<std::int32_t>(cpu::argmax_row(l, vocab));
  // A NaN or +inf logit, or only -inf ones, leaves no distribution to sample (and a NaN breaks
  // the sort's ordering): an error naming the logit, as torch.multinomial raises, not a token.
  bool any_finite = false;
  for (std::int64_t i = 0; i < vocab; ++i) {
    if (std::isnan(l[i]) || l[i] == std::numeric_limits<float>::infinity())
      fail<ValueError>("sampling at temperature ", options_.temperature, ": logit ", i, " of ",
                       vocab, " is ", l[i],
                       " (the model produced a non-finite value; temperature 0 picks by argmax)");
    any_finite |= std::isfinite(l[i]);
  }
  if (!any_finite)
    fail<ValueError>("sampling at temperature ", options_.temperature, ": all ", vocab,
                     " logits are -inf");
  // Candidates sorted by logit; top-k, then softmax at the temperature, then top-p.
  std::vector<std::int32_t> order(static_cast<std::size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  std::int64_t keep = options_.top_k > 0 ? std::min(options_.top_k, vocab) : vocab;
  std::partial_sort(
      order.begin(), order.begin() + keep, order.end(),
      [&](std::int32_t a, std::int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
  order.resize(static_cast<std::size_t>(keep));
  std::vector<double> p(order.size());
  const double top = l[order[0]];
  double sum = 0;
  for (std::size_t i = 0; i < order.size(); ++i)
    sum += (p[i] = std::exp((l[order[i]] - top) / options_.temperature));
  double cumulative = 0;
  std::size_t cut = order.size();
  for (std::size_t i = 0; i < order.size(); ++i) {
    p[i] /= sum;
    cumulative += p[i];
    if (cumulative >= options_.top_p) {
      cut = i + 1;
      break;
    }
  }
  std::discrete_distribution<std::size_t> pick(p.begin(),
                                               p.begin() + static_cast<std::ptrdiff_t>(cut));
  return order[pick(rng_)];
}

struct Generator::Feedback {
  Device device;
  Tensor ids;  // [1] i32 on `device`: the next continuing step's token
#ifdef SPLICE_WITH_CUDA
  // CUDA: the argmax's mirror ring, [kMirrorSlots] pinned int32; step n (n = `launched` when it
  // was launched) writes slot n % kMirrorSlots, counted on the device by `counter` ([1]).
  std::int32_t* mirror = nullptr;
  Tensor counter;
  cuda::Event done[kMirrorSlots] = {};  // recorded after step n into done[n % kMirrorSlots]
#endif
  std::int32_t* staging = nullptr;  // CUDA: pinned [1], a host token on its way into `ids`
  std::uint64_t launched = 0;       // session steps so far (each runs the epilogue once)
  Feedback() = default;
  Feedback(const Feedback&) = delete;
  Feedback& operator=(const Feedback&) = delete;
  ~Feedback() {
#ifdef SPLICE_WITH_CUDA
    cuda::free_pinned(mirror);
    cuda::free_pinned(staging);
    for (cuda::Event e : done)
      if (e != nullptr) cuda::destroy_event(e);
#endif
  }
  // The session epilogue: ids = argmax(logits) (and the mirror ring on CUDA).
  void choose(const Tensor& logits) {
    if (device.is_cpu()) return cpu::argmax(logits, ids);
#ifdef SPLICE_WITH_CUDA
    cuda::ArgmaxOptions options;
    options.host_mirror = mirror;
    options.mirror_counter = static_cast<std::uint32_t*>(counter.raw_data());
    options.mirror_slots = kMirrorSlots;
    cuda::argmax(logits, ids, options);
#else
    fail<DeviceError>("Generator: ", device.str(),
                      " needs the CUDA backend, absent from this build");
#endif
  }
};

Generator::Generator(DecodeModel model, const GeneratorOptions& options)
    : config_(model.config), max_seq_len_(model.options.max_seq_len), device_(options.device) {
  if (model.options.batch != 1)
    fail<ValueError>("Generator decodes batch 1, got batch ", model.options.batch);
  OptimizeOptions opt = options.optimize;
  opt.tune.device = options.device;
  decisions_ =
      optimize_graph(model.graph, model.attention_specs, opt, model.kda_specs, model.layer_specs);
  SessionOptions so;
  so.device = options.device;
  so.measure_host_overhead = options.measure_host_overhead;
  so.name = "decode step";
  if (options.greedy_in_step) {
    bool has_logits = false;
    for (const auto& [name, id] : model.graph.outputs()) has_logits |= name == "logits";
    if (!has_logits) fail<GraphError>("Generator: the decode graph has no output 'logits'");
    feedback_ = std::make_shared<Feedback>();
    feedback_->device = options.device;
    // The closure shares the buffers (not `this`): a moved Generator keeps working.
    std::shared_ptr<Feedback> feedback = feedback_;
    so.epilogue = [feedback](const std::map<std::string, Tensor>& outputs) {
      feedback->choose(outputs.at("logits"));  // [1, vocab]
    };
  }
  overrun_is_harmless_ = overrun_is_harmless(model.graph);
  session_ = std::make_unique<Session>(std::move(model.graph), so);
  token_host_ = Tensor::empty({1}, DType::i32);
  if (!feedback_) return;
  if (device_.is_cpu()) {
    feedback_->ids = Tensor::zeros({1}, DType::i32);
    return;
  }
#ifdef SPLICE_WITH_CUDA
  feedback_->ids = session_->input_buffer("tokens");  // [1]
  feedback_->mirror =
      static_cast<std::int32_t*>(cuda::alloc_pinned(kMirrorSlots * sizeof(std::int32_t)));
  feedback_->staging = static_cast<std::int32_t*>(cuda::alloc_pinned(sizeof(std::int32_t)));
  std::fill(feedback_->mirror, feedback_->mirror + kMirrorSlots, kNoChoice);
  feedback_->counter = Tensor::zeros({1}, DType::i32, device_);  // read as uint32
  for (cuda::Event& e : feedback_->done) e = cuda::create_event();
#endif
}

void Generator::reset() {
  session_->reset_states();
  position_ = 0;
  has_choice_ = false;
  last_choice_.reset();
}

void Generator::check_token(std::int32_t token) const {
  if (token < 0 || token >= config_.vocab_size)
    fail<ValueError>("token id ", token, " is outside the vocabulary [0, ", config_.vocab_size,
                     ")");
}

void Generator::check_room(std::int64_t tokens) const {
  if (position_ + tokens > max_seq_len_)
    fail<ValueError>("the sequence is full: max_seq_len ", max_seq_len_, " positions are used");
}

void Generator::launch_step(const Tensor& tokens) {
  session_->step({{"k_len", position_ + 1}}, {{"tokens", tokens}});
  ++position_;
  if (!feedback_) return;
#ifdef SPLICE_WITH_CUDA
  if (device_.is_cuda())
    cuda::record_event(feedback_->done[feedback_->launched % kMirrorSlots],
                       cuda::shared_stream(device_.index));
#endif
  ++feedback_->launched;
}

std::int32_t Generator::read_choice() { return read_choice(feedback_->launched - 1); }

std::int32_t Generator::read_choice(std::uint64_t step) {
  SPLICE_INTERNAL_CHECK(step < feedback_->launched && step + kMirrorSlots >= feedback_->launched,
                        "read_choice: step ", step, " of ", feedback_->launched, " launched");
  std::int32_t id = kNoChoice;
  if (device_.is_cpu()) {
    id = feedback_->ids.data<std::int32_t>()[0];
  } else {
#ifdef SPLICE_WITH_CUDA
    cuda::event_synchronize(feedback_->done[step % kMirrorSlots]);
    volatile std::int32_t* slot = feedback_->mirror + step % kMirrorSlots;
    id = *slot;
    *slot = kNoChoice;
#endif
  }
  SPLICE_INTERNAL_CHECK(id >= 0 && id < config_.vocab_size, "the in-step argmax left id ", id,
                        " for a vocabulary of ", config_.vocab_size);
  return id;
}

Tensor Generator::step(std::int32_t token) {
  check_token(token);
  check_room(1);
  has_choice_ = false;
  last_choice_.reset();
  token_host_.data<std::int32_t>()[0] = token;
  const Tensor tokens = device_.is_cpu() ? token_host_ : token_host_.to_device(device_);
  launch_step(tokens);
  const Tensor logits = session_->output("logits");  // [1, vocab]
  return (logits.device().is_cpu() ? logits : logits.to_device(Device::cpu())).select(0, 0);
}

std::int32_t Generator::step_greedy(std::optional<std::int32_t> token) {
  if (!token && !has_choice_)
    fail<ValueError>(
        "step_greedy: there is no previous greedy step to continue (none since "
        "construction, reset(), step() or generate()); pass the token to append");
  if (token) check_token(*token);
  check_room(1);
  if (!feedback_) {  // the host path
    Sampler greedy({});
    const std::int32_t pick = greedy.sample(step(token ? *token : *last_choice_));
    last_choice_ = pick;
    has_choice_ = true;
    return pick;
  }
  if (token) {
    if (device_.is_cpu()) {
      feedback_->ids.data<std::int32_t>()[0] = *token;
    } else {
#ifdef SPLICE_WITH_CUDA
      // The previous read_choice() (or construction) left the stream idle: staging is free.
      *feedback_->staging = *token;
      cuda::copy_async(feedback_->ids.raw_data(), feedback_->staging, sizeof(std::int32_t),
                       cuda::shared_stream(device_.index));
#endif
    }
  }
  has_choice_ = false;  // until this step's pick is read
  launch_step(feedback_->ids);
  const std::int32_t pick = read_choice();
  has_choice_ = true;
  return pick;
}

void Generator::check_generate(const std::vector<std::int32_t>& prompt,
                               const GenerateOptions& options) const {
  if (prompt.empty()) fail<ValueError>("the prompt must hold at least one token");
  validate(options);
  if (position_ + static_cast<std::int64_t>(prompt.size()) > max_seq_len_)
    fail<ValueError>("the prompt (", prompt.size(),
                     " tokens) does not fit: ", max_seq_len_ - position_,
                     " positions are left of max_seq_len ", max_seq_len_);
  for (std::int32_t t : prompt) check_token(t);
}

GenerateResult Generator::generate(const std::vector<std::int32_t>& prompt,
                                   const GenerateOptions& options) {
  check_generate(prompt, options);
  Sampler sampler(options.sampling);
  GenerateResult result;
  result.greedy_in_step = feedback_ != nullptr && options.sampling.temperature == 0.0f;
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  std::vector<Tensor> kept;
  // This step's logits [vocab] as a host tensor of its own (outputs are arena views).
  auto host_logits = [&]() {
    const Tensor l = session_->output("logits");  // [1, vocab]
    return (l.device().is_cpu() ? l.clone() : l.to_device(Device::cpu())).select(0, 0);
  };
  auto stops = [&](std::int32_t token) {
    return std::find(options.stop_tokens.begin(), options.stop_tokens.end(), token) !=
           options.stop_tokens.end();
  };
  has_choice_ = false;
  last_choice_.reset();
  if (result.greedy_in_step) {
    Tensor prompt_host =
        Tensor::empty({static_cast<std::int64_t>(prompt.size())}, DType::i32);  // [prompt]
    std::copy(prompt.begin(), prompt.end(), prompt_host.data<std::int32_t>());
    // [prompt] i32 on the session's device, uploaded once; prompt steps read views of it.
    const Tensor prompt_ids = device_.is_cpu() ? prompt_host : prompt_host.to_device(device_);
    for (std::int64_t i = 0; i < prompt_ids.numel(); ++i) {
      launch_step(prompt_ids.slice(0, i, i + 1));  // [1]
      if (options.keep_logits) kept.push_back(host_logits());
    }
    std::int32_t next = read_choice();
    result.prefill_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    result.prompt_logits = host_logits();
    // Pipelined (generate.h): the step that computes token i + 1 is launched before token i is
    // read, so the host's read, streaming and next launch overlap the device's step. Not with
    // keep_logits (each step's logits are read before the next overwrites them), and not where a
    // step launched past a stop token could not be taken back.
    result.pipelined = device_.is_cuda() && !options.keep_logits &&
                       (options.stop_tokens.empty() || overrun_is_harmless_);
    // Whether token i + 1 is wanted once token i is known not to stop the loop.
    auto room_after = [&](std::int64_t i) {
      return i + 1 < options.max_new_tokens && position_ < max_seq_len_;
    };
    auto launch = [&]() -> std::uint64_t {  // the step that reads the last pick from `ids`
      launch_step(feedback_->ids);
      return feedback_->launched - 1;
    };
    std::optional<std::uint64_t> in_flight;  // the launched step computing token i + 1
    if (result.pipelined && room_after(0)) in_flight = launch();
    auto s0 = Clock::now();
    for (std::int64_t i = 0; i < options.max_new_tokens; ++i) {
      result.tokens.push_back(next);
      if (options.on_token) options.on_token(next);
      if (stops(next)) {
        result.stopped_on_token = true;
        if (in_flight) {  // the step past the stop: wait for it, then take its row back
          read_choice(*in_flight);
          --position_;
        }
        break;
      }
      if (!room_after(i)) break;
      if (!in_flight) in_flight = launch();
      std::optional<std::uint64_t> after;  // pipelined: the step after token i + 1 goes out first
      if (result.pipelined && room_after(i + 1)) after = launch();
      next = read_choice(*in_flight);
      in_flight = after;
      const auto now = Clock::now();
      result.step_us.push_back(std::chrono::duration<double, std::micro>(now - s0).count());
      s0 = now;
      if (options.keep_logits) kept.push_back(host_logits());
    }
  } else {
    Tensor logits;
    for (std::int32_t t : prompt) {
      logits = step(t);
      if (options.keep_logits) kept.push_back(logits.clone());
    }
    result.prefill_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    result.prompt_logits = logits.clone();
    for (std::int64_t i = 0; i < options.max_new_tokens; ++i) {
      const std::int32_t next = sampler.sample(logits);
      result.tokens.push_back(next);
      if (options.on_token) options.on_token(next);
      if (stops(next)) {
        result.stopped_on_token = true;
        break;
      }
      if (i + 1 == options.max_new_tokens || position_ >= max_seq_len_) break;
      const auto s0 = Clock::now();
      logits = step(next);
      result.step_us.push_back(
          std::chrono::duration<double, std::micro>(Clock::now() - s0).count());
      if (options.keep_logits) kept.push_back(logits.clone());
    }
  }
  has_choice_ = false;
  last_choice_.reset();
  if (options.keep_logits) {
    const std::int64_t vocab = result.prompt_logits.numel();
    result.all_logits = Tensor::empty({static_cast<std::int64_t>(kept.size()), vocab}, DType::f32);
    for (std::size_t i = 0; i < kept.size(); ++i)
      result.all_logits.select(0, static_cast<std::int64_t>(i)).copy_from(kept[i]);
  }
  return result;
}

}  // namespace splice
