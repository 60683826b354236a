// splice/model/generate.h: the decode loop.
//
//   1. Optimize the model's decode graph once (offer fused arms, verify/time/choose per k_len
//      bucket, persist) and plan it once into a Session on the device.
//   2. Prefill: feed the prompt one token per step through the same planned graph (k_len = 1, 2,
//      ...), keeping only the last logits. (One graph serves prefill and decode: no second plan.)
//   3. Decode: sample the next token (greedy, or temperature / top-k / top-p with a seeded
//      generator, reproducible), stream it, stop at a stop token, the token budget or the
//      capacity (max_seq_len).
#pragma once

#include <cstdint>
#include <functional>
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

// Picks a token from logits [vocab] (host f32). Validates the options (ValueError naming them).
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
};

struct GenerateOptions {
  std::int64_t max_new_tokens = 32;
  std::vector<std::int32_t> stop_tokens;
  SamplingOptions sampling;
  std::function<void(std::int32_t)> on_token;  // streaming
  bool keep_logits = false;                    // fill GenerateResult::all_logits
};

struct GenerateResult {
  std::vector<std::int32_t> tokens;  // generated (stop token included when hit)
  bool stopped_on_token = false;
  Tensor prompt_logits;  // [vocab] f32 at the last prompt position
  Tensor all_logits;     // [steps, vocab] f32 after every fed token (keep_logits)
  double prefill_seconds = 0;
  std::vector<double> step_us;  // wall time of each decode step (logits on the host)
};

class Generator {
 public:
  Generator(DecodeModel model, const GeneratorOptions& options);
  // One step: appends `token` at the next position, returns the logits [vocab] (host f32).
  Tensor step(std::int32_t token);
  GenerateResult generate(const std::vector<std::int32_t>& prompt, const GenerateOptions& options);
  void reset();  // empties every cache; position 0 again
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
  std::int64_t position_ = 0;
  Tensor token_host_;
};

}  // namespace splice
