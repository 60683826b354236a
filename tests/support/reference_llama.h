// A float64 Llama-family forward pass for one sequence, written from the Hugging Face modeling
// code's math with plain loops (no splice graph code): the reference for model tests.
#pragma once

#include <cstdint>
#include <vector>

#include "splice/model/config.h"
#include "splice/model/model.h"

namespace splice::testing {

class ReferenceLlama {
 public:
  ReferenceLlama(const ModelConfig& config, const Weights& weights);
  // Appends `token` and returns the logits [vocab] at its position.
  std::vector<double> step(std::int32_t token);

 private:
  using Matrix = std::vector<double>;  // row-major
  struct Layer {
    Matrix wq, wk, wv, wo, gate, up, down, norm1, norm2;
    std::vector<std::vector<double>> k_cache, v_cache;  // [position][kv_heads * head_dim]
  };
  Matrix load(const Weights& w, const std::string& name) const;
  ModelConfig c_;
  Matrix embed_, final_norm_, lm_head_;
  std::vector<Layer> layers_;
  std::int64_t position_ = 0;
};

}  // namespace splice::testing
