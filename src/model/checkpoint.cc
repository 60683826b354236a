// Checkpoint: a Hugging Face directory or a GGUF file behind one name -> tensor interface (see
// checkpoint.h).
//
//   1. Decide the format: a directory is Hugging Face; a file starting with "GGUF" is GGUF; a
//      config.json / *.safetensors file means its directory.
//   2. Hugging Face: load config.json; open model.safetensors, or read the index's weight_map,
//      open each shard once and check that the shards hold exactly the mapped tensors.
//   3. GGUF: config_from_gguf; map every tensor to its Hugging Face name.
//   4. Load the tokenizer when there is one.
#include "splice/model/checkpoint.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "splice/core/error.h"
#include "splice/model/gguf.h"
#include "splice/model/safetensors.h"

namespace splice {

namespace fs = std::filesystem;

struct Checkpoint::Source {
  std::vector<SafeTensorsFile> shards;
  std::map<std::string, std::size_t> shard_of;  // Hugging Face name -> shard
  std::optional<GgufFile> gguf;
  std::map<std::string, std::string> gguf_name;  // Hugging Face name -> GGUF name
  std::int64_t q_heads = 0, kv_heads = 0;        // for the q/k row order
};

namespace {

bool starts_with_gguf_magic(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  char magic[4] = {};
  in.read(magic, sizeof magic);
  return in.gcount() == sizeof magic && std::memcmp(magic, "GGUF", sizeof magic) == 0;
}

std::string read_text(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) fail<IoError>(file.string(), ": cannot open");
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// Stage 2 for a sharded checkpoint.
void open_shards(const fs::path& dir, const fs::path& index, std::vector<SafeTensorsFile>& shards,
                 std::map<std::string, std::size_t>& shard_of) {
  using Json = nlohmann::json;
  Json j;
  try {
    j = Json::parse(read_text(index));
  } catch (const Json::exception& e) {
    fail<IoError>(index.string(), ": not valid JSON: ", e.what());
  }
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    fail<IoError>(index.string(), ": must be an object with a `weight_map` object");
  std::map<std::string, std::size_t> file_index;
  std::map<std::string, std::set<std::string>> expected;  // shard file -> names mapped to it
  for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
    if (!it.value().is_string())
      fail<IoError>(index.string(), ": `weight_map` value of '", it.key(), "' must be a string");
    const std::string file = it.value().get<std::string>();
    if (file.empty() || file.find('/') != std::string::npos || file == "." || file == "..")
      fail<IoError>(index.string(), ": shard name '", file, "' must be a file in the directory");
    if (!file_index.count(file)) {
      file_index[file] = shards.size();
      shards.push_back(SafeTensorsFile::open((dir / file).string()));
    }
    shard_of[it.key()] = file_index[file];
    expected[file].insert(it.key());
  }
  for (const auto& [file, names] : expected) {
    const SafeTensorsFile& shard = shards[file_index[file]];
    for (const auto& name : names)
      if (!shard.has(name))
        fail<IoError>(index.string(), ": tensor '", name, "' is mapped to ", file,
                      ", which does not hold it");
    for (const auto& name : shard.names())
      if (!names.count(name))
        fail<IoError>(index.string(), ": ", file, " holds tensor '", name,
                      "', which the weight_map maps elsewhere or not at all");
  }
}

}  // namespace

Checkpoint Checkpoint::open(const std::string& path) {
  Checkpoint c;
  c.path_ = path;
  auto source = std::make_shared<Source>();
  std::error_code ec;
  fs::path p(path);
  if (!fs::exists(p, ec)) fail<IoError>(path, ": no such file or directory");
  // Stage 1.
  if (!fs::is_directory(p, ec)) {
    if (starts_with_gguf_magic(p)) {
      // Stage 3.
      c.format_ = Format::gguf;
      source->gguf = GgufFile::open(path);
      const GgufFile& g = *source->gguf;
      c.config_ = config_from_gguf(g);
      source->q_heads = c.config_.num_attention_heads;
      source->kv_heads = c.config_.num_key_value_heads;
      for (const auto& name : g.names()) {
        const std::string hf = hf_name_of_gguf_tensor(name);
        if (hf.empty())
          fail<UnsupportedError>(path, ": tensor '", name,
                                 "' has no Hugging Face Llama counterpart");
        source->gguf_name[hf] = name;
      }
      if (g.has_key("tokenizer.ggml.model")) c.tokenizer_ = Tokenizer::from_gguf(g);
      c.source_ = std::move(source);
      return c;
    }
    const std::string name = p.filename().string();
    if (name != "config.json" && p.extension() != ".safetensors")
      fail<UnsupportedError>(path, ": not a GGUF file, a config.json or a .safetensors file");
    p = p.parent_path().empty() ? fs::path(".") : p.parent_path();
  }
  // Stage 2.
  c.format_ = Format::safetensors;
  c.config_ = load_config(p.string());
  const fs::path single = p / "model.safetensors";
  const fs::path index = p / "model.safetensors.index.json";
  if (fs::exists(single, ec)) {
    source->shards.push_back(SafeTensorsFile::open(single.string()));
    for (const auto& name : source->shards[0].names()) source->shard_of[name] = 0;
  } else if (fs::exists(index, ec)) {
    open_shards(p, index, source->shards, source->shard_of);
  } else {
    fail<IoError>(p.string(), ": has neither model.safetensors nor model.safetensors.index.json");
  }
  // Stage 4.
  if (fs::exists(p / "tokenizer.json", ec))
    c.tokenizer_ = Tokenizer::from_json_file((p / "tokenizer.json").string());
  c.source_ = std::move(source);
  return c;
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  if (format_ == Format::gguf) {
    for (const auto& [hf, gguf] : source_->gguf_name) out.push_back(hf);
  } else {
    for (const auto& [name, shard] : source_->shard_of) out.push_back(name);
  }
  return out;
}

bool Checkpoint::has(const std::string& name) const {
  return format_ == Format::gguf ? source_->gguf_name.count(name) != 0
                                 : source_->shard_of.count(name) != 0;
}

Dims Checkpoint::shape(const std::string& name) const {
  if (!has(name)) fail<IoError>(path_, ": no tensor named '", name, "'");
  if (format_ == Format::gguf) return source_->gguf->info(source_->gguf_name.at(name)).shape;
  return source_->shards[source_->shard_of.at(name)].info(name).shape;
}

Tensor Checkpoint::tensor(const std::string& name, DType dtype) const {
  if (!has(name)) fail<IoError>(path_, ": no tensor named '", name, "'");
  if (format_ == Format::gguf) {
    Tensor t = source_->gguf->tensor(source_->gguf_name.at(name), DType::f32);
    if (name.ends_with("self_attn.q_proj.weight")) t = gguf_unpermute_qk(t, source_->q_heads);
    if (name.ends_with("self_attn.k_proj.weight")) t = gguf_unpermute_qk(t, source_->kv_heads);
    return dtype == DType::f32 ? t : t.to(dtype);
  }
  const SafeTensorsFile& shard = source_->shards[source_->shard_of.at(name)];
  DType stored;
  if (safetensors_native_dtype(shard.info(name).dtype, &stored) && stored == dtype)
    return shard.tensor(name);
  return shard.tensor_as(name, dtype);
}

}  // namespace splice
