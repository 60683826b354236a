// libFuzzer target for the GGUF parser: every input either parses into a file whose metadata and
// tensors all read back (dequantized to f32) or is rejected with a splice::Error. Crashes,
// sanitizer reports, runaway memory and any other exception are bugs.
//
// Built and run by run_fuzz.sh, which writes a seed corpus of valid files first.
#include <cstddef>
#include <cstdint>

#include "splice/core/error.h"
#include "splice/model/gguf.h"
#include "splice/model/tokenizer.h"

namespace {
// Dequantizing is linear in the tensor size; bound it so each input stays fast.
constexpr std::int64_t kMaxElements = 1 << 20;
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    splice::GgufFile file = splice::GgufFile::parse(data, size, "fuzz.gguf");
    for (const auto& key : file.keys()) (void)file.find(key);
    for (const auto& name : file.names()) {
      const splice::GgufTensorInfo& info = file.info(name);
      if (info.numel() <= kMaxElements) (void)file.tensor(name);
    }
    try {
      (void)splice::config_from_gguf(file);
    } catch (const splice::Error&) {
    }
    (void)splice::Tokenizer::from_gguf(file).encode("Hello 123 <|im_start|>");
  } catch (const splice::Error&) {
    // Rejected input: the expected outcome for most mutations.
  }
  return 0;
}
