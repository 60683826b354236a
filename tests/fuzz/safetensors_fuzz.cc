// libFuzzer target for the safetensors parser: every input either parses into a file whose
// tensors all read back (zero-copy where possible, converted to f32 otherwise) or is rejected
// with a splice::Error. Crashes, sanitizer reports and any other exception are bugs.
//
// Built and run by run_fuzz.sh (clang++ -fsanitize=fuzzer,address,undefined), which writes a
// seed corpus of valid files first.
#include <cstddef>
#include <cstdint>

#include "splice/core/error.h"
#include "splice/model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    splice::SafeTensorsFile file = splice::SafeTensorsFile::parse(data, size, "fuzz");
    for (const auto& name : file.names()) {
      const splice::SafeTensorInfo& info = file.info(name);
      splice::DType native;
      if (splice::safetensors_native_dtype(info.dtype, &native)) {
        splice::Tensor view = file.tensor(name);
        // Touch the last byte of the view: it must lie inside the mapping.
        if (view.numel() > 0) (void)view.at_linear(view.numel() - 1);
      }
      (void)file.tensor_as(name, splice::DType::f32);
    }
  } catch (const splice::Error&) {
    // Rejected input: the expected outcome for most mutations.
  }
  return 0;
}
