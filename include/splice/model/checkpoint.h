// splice/model/checkpoint.h: one entry point for a model on disk, whatever its format.
//
// `Checkpoint::open(path)` accepts
//   - a Hugging Face directory: config.json plus model.safetensors, or plus
//     model.safetensors.index.json and the shards its `weight_map` names (every shard must exist
//     and hold exactly the tensors mapped to it; a tensor in two shards is an error);
//     tokenizer.json when present;
//   - a GGUF file (llama architecture): the config from its metadata, tensors under their Hugging
//     Face names with q/k rows restored (gguf.h), the tokenizer from its metadata.
// Tensors are read lazily by Hugging Face name: `tensor(name, dtype)` is a zero-copy view when the
// stored dtype is already `dtype` (safetensors), else a converted or dequantized copy. Graph
// builders take weights from here and never see the file format.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "splice/core/tensor.h"
#include "splice/model/config.h"
#include "splice/model/tokenizer.h"

namespace splice {

class Checkpoint {
 public:
  enum class Format : std::uint8_t { safetensors, gguf };

  // IoError for a missing or malformed file, UnsupportedError for an unknown format/architecture.
  static Checkpoint open(const std::string& path);

  const std::string& path() const { return path_; }
  Format format() const { return format_; }
  const ModelConfig& config() const { return config_; }
  // The tokenizer (tokenizer.json or GGUF metadata), if the checkpoint has one.
  const std::optional<Tokenizer>& tokenizer() const { return tokenizer_; }

  // Tensor names (Hugging Face spelling), sorted.
  std::vector<std::string> names() const;
  bool has(const std::string& name) const;
  // Row-major shape; IoError naming the checkpoint when the tensor is absent.
  Dims shape(const std::string& name) const;
  // The tensor as `dtype` (see the header comment); IoError when absent.
  Tensor tensor(const std::string& name, DType dtype) const;

 private:
  struct Source;
  std::string path_;
  Format format_ = Format::safetensors;
  ModelConfig config_;
  std::optional<Tokenizer> tokenizer_;
  std::shared_ptr<const Source> source_;
};

}  // namespace splice
