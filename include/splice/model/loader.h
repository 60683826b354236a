// splice/model/loader.h: open a model the way users have it.
//
//   * a directory with config.json + *.safetensors (+ tokenizer.json when present), Llama family
//     or FLA's KDAForCausalLM;
//   * a GGUF file (llama architecture; quantized tensors are dequantized, q/k rows restored to
//     Hugging Face order, the tokenizer read from the GGUF metadata).
#pragma once

#include <optional>
#include <string>

#include "splice/model/config.h"
#include "splice/model/model.h"
#include "splice/model/tokenizer.h"

namespace splice {

struct LoadedModel {
  ModelConfig config;
  Weights weights;
  std::optional<Tokenizer> tokenizer;
  std::string source;
};

// Throws IoError (missing file, malformed content) or UnsupportedError (unknown architecture)
// naming the path.
LoadedModel load_model(const std::string& path, DType weight_dtype = DType::f32);

}  // namespace splice
