// Model loading from a Hugging Face directory or a GGUF file (see loader.h).
#include "splice/model/loader.h"

#include <filesystem>

#include "splice/core/error.h"
#include "splice/model/gguf.h"

namespace splice {

LoadedModel load_model(const std::string& path, DType weight_dtype) {
  namespace fs = std::filesystem;
  if (!fs::exists(path)) fail<IoError>("model '", path, "' does not exist");
  LoadedModel m;
  m.source = path;
  if (fs::is_directory(path)) {
    const std::string config = (fs::path(path) / "config.json").string();
    if (!fs::exists(config)) fail<IoError>("model directory '", path, "' has no config.json");
    m.config = load_config(config);
    m.weights = Weights::from_directory(path);
    const std::string tokenizer = (fs::path(path) / "tokenizer.json").string();
    if (fs::exists(tokenizer)) m.tokenizer = Tokenizer::from_json_file(tokenizer);
    return m;
  }
  if (fs::path(path).extension() == ".gguf") {
    const GgufFile file = GgufFile::open(path);
    m.config = config_from_gguf(file);
    m.weights = Weights::from_tensors(llama_tensors_from_gguf(file, weight_dtype));
    m.tokenizer = Tokenizer::from_gguf(file);
    return m;
  }
  fail<IoError>("model '", path,
                "' is neither a directory (config.json + safetensors) nor a .gguf file");
}

}  // namespace splice
