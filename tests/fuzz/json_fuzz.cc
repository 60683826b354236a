// libFuzzer target for the JSON model files: every input is read both as a config.json and as a
// tokenizer.json; each either loads (the tokenizer then encodes and decodes a probe string) or is
// rejected with a splice::Error. Crashes, sanitizer reports, runaway memory and any other
// exception (a stray nlohmann error included) are bugs.
//
// Built and run by run_fuzz.sh, which writes a seed corpus of valid files first.
#include <cstddef>
#include <cstdint>
#include <string>

#include "splice/core/error.h"
#include "splice/model/config.h"
#include "splice/model/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const splice::ModelConfig config = splice::parse_config(text, "fuzz/config.json");
    (void)splice::parse_config(splice::to_config_json(config), "fuzz/roundtrip.json");
  } catch (const splice::Error&) {
  }
  try {
    const splice::Tokenizer tokenizer = splice::Tokenizer::from_json(text, "fuzz/tokenizer.json");
    (void)tokenizer.decode(tokenizer.encode("Hi 12 <|end|>\xC3"));
    (void)splice::Tokenizer::from_json(tokenizer.to_json());
  } catch (const splice::Error&) {
  }
  return 0;
}
