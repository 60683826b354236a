// The decode loop and the sampler (see generate.h).
#include "splice/model/generate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

#include "splice/core/error.h"

namespace splice {

Sampler::Sampler(SamplingOptions options) : options_(options), rng_(options.seed) {
  if (!(options.temperature >= 0) || !std::isfinite(options.temperature))
    fail<ValueError>("temperature must be finite and >= 0, got ", options.temperature);
  if (options.top_k < 0) fail<ValueError>("top_k must be >= 0, got ", options.top_k);
  if (!(options.top_p > 0 && options.top_p <= 1))
    fail<ValueError>("top_p must be in (0, 1], got ", options.top_p);
}

std::int32_t Sampler::sample(const Tensor& logits) {
  const std::int64_t vocab = logits.numel();
  const Tensor flat = logits.contiguous().to(DType::f32);
  const float* l = flat.data<float>();
  if (options_.temperature == 0.0f)
    return static_cast<std::int32_t>(std::max_element(l, l + vocab) - l);
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
  session_ = std::make_unique<Session>(std::move(model.graph), so);
  token_host_ = Tensor::empty({1}, DType::i32);
}

void Generator::reset() {
  session_->reset_states();
  position_ = 0;
}

Tensor Generator::step(std::int32_t token) {
  if (token < 0 || token >= config_.vocab_size)
    fail<ValueError>("token id ", token, " is outside the vocabulary [0, ", config_.vocab_size,
                     ")");
  if (position_ >= max_seq_len_)
    fail<ValueError>("the sequence is full: max_seq_len ", max_seq_len_, " positions are used");
  token_host_.data<std::int32_t>()[0] = token;
  const Tensor tokens = device_.is_cpu() ? token_host_ : token_host_.to_device(device_);
  session_->step({{"k_len", position_ + 1}}, {{"tokens", tokens}});
  ++position_;
  const Tensor logits = session_->output("logits");  // [1, vocab]
  return (logits.device().is_cpu() ? logits : logits.to_device(Device::cpu())).select(0, 0);
}

GenerateResult Generator::generate(const std::vector<std::int32_t>& prompt,
                                   const GenerateOptions& options) {
  if (prompt.empty()) fail<ValueError>("the prompt must hold at least one token");
  if (options.max_new_tokens < 0)
    fail<ValueError>("max_new_tokens must be >= 0, got ", options.max_new_tokens);
  if (position_ + static_cast<std::int64_t>(prompt.size()) > max_seq_len_)
    fail<ValueError>("the prompt (", prompt.size(),
                     " tokens) does not fit: ", max_seq_len_ - position_,
                     " positions are left of max_seq_len ", max_seq_len_);
  Sampler sampler(options.sampling);
  GenerateResult result;
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  Tensor logits;
  std::vector<Tensor> kept;
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
    if (std::find(options.stop_tokens.begin(), options.stop_tokens.end(), next) !=
        options.stop_tokens.end()) {
      result.stopped_on_token = true;
      break;
    }
    if (i + 1 == options.max_new_tokens || position_ >= max_seq_len_) break;
    const auto s0 = Clock::now();
    logits = step(next);
    result.step_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - s0).count());
    if (options.keep_logits) kept.push_back(logits.clone());
  }
  if (options.keep_logits) {
    const std::int64_t vocab = logits.numel();
    result.all_logits = Tensor::empty({static_cast<std::int64_t>(kept.size()), vocab}, DType::f32);
    for (std::size_t i = 0; i < kept.size(); ++i)
      result.all_logits.select(0, static_cast<std::int64_t>(i)).copy_from(kept[i]);
  }
  return result;
}

}  // namespace splice
