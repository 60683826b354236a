// Host storage for the model-file readers (safetensors, GGUF): an aligned owned buffer, and a
// private read-write memory map of a whole file (pages written through a view are copied; the file
// never changes).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "splice/core/tensor.h"

namespace splice {

// An owned, 64-byte-aligned host buffer of `bytes` bytes.
std::shared_ptr<Storage> host_buffer(std::size_t bytes);

// Maps the regular file `path`. Throws IoError "<path>: <reason>" when it cannot be opened,
// stat'ed or mapped, is not a regular file, or is shorter than `min_bytes` (the reason then is
// `too_small(size)`).
std::shared_ptr<Storage> map_file(const std::string& path, std::size_t min_bytes,
                                  const std::function<std::string(std::size_t)>& too_small);

}  // namespace splice
