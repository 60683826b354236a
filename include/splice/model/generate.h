// splice/model/generate.h: the decode loop.
//
//   1. Optimize the model's decode graph once (offer fused arms, verify/time/choose per k_len
//      bucket, persist) and plan it once into a Session on the device.
//   2. Prefill: feed the prompt one token per step through the same planned graph (k_len = 1, 2,
//      ...), keeping only the last logits. (One graph serves prefill and decode: no second plan.)
//   3. Decode: sample the next token (greedy, or temperature / top-k / top-p with a seeded
//      generator, reproducible), stream it, stop at a stop token, the token budget or the
//      capacity (max_seq_len).
//
// Greedy in the step (GeneratorOptions::greedy_in_step, the default): the Session runs an
// epilogue after every step, argmax(logits) -> the "tokens" input buffer (cuda::argmax, captured
// into the step's CUDA graph; cpu::argmax on the CPU), so a greedy decode step reads the token the
// previous step chose where it already is: no token upload and no logits download per token, only
// the chosen id comes back (on CUDA the kernel also writes it to pinned host memory: no copy call;
// the host waits for the stream once per token, for streaming output and stop tokens). Prompt
// tokens are uploaded once per generate() call and fed from the device. keep_logits still
// downloads every step's logits; sampling with a temperature uses the host path (logits to the
// host, Sampler). Both paths pick the same ids (Sampler's greedy rule, cpu/sampling.h).
//
// Pipelined greedy decode (CUDA, greedy in the step): generate() launches the step that computes
// token i + 1 before it reads token i (the step reads token i from the device buffer the previous
// epilogue wrote), so the host's read-back, streaming callback and next launch overlap the
// device's step instead of following it. The argmax writes each step's id into one of two pinned
// slots (step n: slot n % 2), so the host reads step n while step n + 1 runs. When token i is a
// stop token the step already launched past it is waited for and taken back (the position moves
// back; it appended a KV row past the live length). A recurrent state (KDA) cannot be taken back,
// so with stop tokens such models decode unpipelined (GenerateResult::pipelined says which).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <vector>

#include "splice/exec/session.h"
#include "splice/model/model.h"
#include "splice/passes/decisions.h"
#include "splice/tune/optimize.h"

namespace splice {

struct SamplingOptions {
  float temperature = 0.0f;  // 0: greedy (argmax)
  std::int64_t top_k = 0;    // 0: no top-k filter
  float top_p = 1.0f;        // 1: no nucleus filter
  std::uint64_t seed = 0;
};

// ValueError naming the field unless temperature is finite and >= 0, top_k >= 0 and top_p in
// (0, 1].
void validate(const SamplingOptions& options);

// Picks a token from logits [vocab] (host, any float dtype). Validates the options (ValueError
// naming them). Temperature 0 is greedy: cpu::argmax_row's rule (the first maximum; NaN skipped
// unless at index 0), which the device argmax matches. Above 0, a NaN or +inf logit, or logits
// that are all -inf, are a ValueError naming the logit (no distribution to sample).
class Sampler {
 public:
  explicit Sampler(SamplingOptions options);
  std::int32_t sample(const Tensor& logits);

 private:
  SamplingOptions options_;
  std::mt19937_64 rng_;
};

struct GeneratorOptions {
  Device device = Device::cpu();
  OptimizeOptions optimize;  // optimize.tune.device is set from `device`
  bool measure_host_overhead = false;
  // Greedy decoding chooses each token inside the step (the header's "greedy in the step");
  // false: every greedy token takes the host path (logits to the host, Sampler), e.g. for A/B.
  bool greedy_in_step = true;
};

struct GenerateOptions {
  std::int64_t max_new_tokens = 32;
  std::vector<std::int32_t> stop_tokens;
  SamplingOptions sampling;
  std::function<void(std::int32_t)> on_token;  // streaming
  bool keep_logits = false;                    // fill GenerateResult::all_logits
};

// ValueError naming the field unless max_new_tokens >= 0 and the sampling options are valid
// (what Generator::generate checks before it runs; callers can check before they print).
void validate(const GenerateOptions& options);

struct GenerateResult {
  std::vector<std::int32_t> tokens;  // generated (stop token included when hit)
  bool stopped_on_token = false;
  Tensor prompt_logits;  // [vocab] f32 at the last prompt position
  Tensor all_logits;     // [steps, vocab] f32 after every fed token (keep_logits)
  double prefill_seconds = 0;
  // Wall time of each decode step, until its token (or, on the host path, its logits) is on the
  // host.
  std::vector<double> step_us;
  bool greedy_in_step = false;  // the tokens were chosen inside the steps (no logits download)
  // The decode steps were pipelined: step i + 1 was launched before token i was read (greedy in
  // the step on CUDA, without keep_logits; with stop tokens only where the step launched past a
  // stop can be taken back, i.e. every state is an append-at-k_len - 1 cache).
  bool pipelined = false;
};

class Generator {
 public:
  Generator(DecodeModel model, const GeneratorOptions& options);
  // One step: appends `token` at the next position, returns the logits [vocab] (host f32).
  Tensor step(std::int32_t token);
  // One greedy step: appends `token`, or without one the token the previous step_greedy chose
  // (the greedy pick of its logits), and returns the greedy pick of this step's logits. With
  // greedy_in_step the pick is made inside the step and only its id is read back (a token that
  // continues the previous step never leaves the device); otherwise step() + Sampler. ValueError
  // for a token outside the vocabulary, a full sequence, or a continuation with no previous
  // step_greedy to continue (construction, reset(), step() and generate() leave none).
  std::int32_t step_greedy(std::optional<std::int32_t> token = std::nullopt);
  GenerateResult generate(const std::vector<std::int32_t>& prompt, const GenerateOptions& options);
  // What generate() checks before it runs: ValueError unless the prompt is non-empty, fits the
  // positions left of max_seq_len, holds only ids inside the vocabulary, and the options are
  // valid (validate). Nothing changes.
  void check_generate(const std::vector<std::int32_t>& prompt,
                      const GenerateOptions& options) const;
  void reset();  // empties every cache; position 0 again
  // Whether greedy tokens are chosen inside the step (GeneratorOptions::greedy_in_step).
  bool greedy_in_step() const { return feedback_ != nullptr; }
  std::int64_t position() const { return position_; }
  const DecisionLog& decisions() const { return decisions_; }
  Session& session() { return *session_; }
  const ModelConfig& config() const { return config_; }
  std::int64_t max_seq_len() const { return max_seq_len_; }

 private:
  ModelConfig config_;
  std::int64_t max_seq_len_ = 0;
  Device device_;
  DecisionLog decisions_;
  std::unique_ptr<Session> session_;
  struct Feedback;  // the in-step greedy buffers (generate.cc)
  void check_token(std::int32_t token) const;
  void check_room(std::int64_t tokens) const;
  // Runs one step on `tokens` ([1] i32 on the session's device) without waiting for it.
  void launch_step(const Tensor& tokens);
  // Waits for the last step and returns the id its epilogue chose (greedy_in_step).
  std::int32_t read_choice();
  // The same for session step `step` (counted from construction), one of the last two launched.
  std::int32_t read_choice(std::uint64_t step);
  bool overrun_is_harmless_ = false;  // generate.cc's overrun_is_harmless of the decode graph
  std::int64_t position_ = 0;
  Tensor token_host_;
  std::shared_ptr<Feedback> feedback_;       // null without greedy_in_step
  std::optional<std::int32_t> last_choice_;  // host path: the previous step_greedy's pick
  bool has_choice_ = false;                  // greedy_in_step: the buffer holds a pick
};

}  // namespace splice
