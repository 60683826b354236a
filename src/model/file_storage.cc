// Aligned host buffers and private file mappings for the model-file readers (see file_storage.h).
#include "model/file_storage.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "splice/core/error.h"

namespace splice {
namespace {
constexpr std::size_t kBufferAlignment = 64;  // cache line: aligned vector loads in the kernels
std::string errno_text() { return std::strerror(errno); }
}  // namespace

std::shared_ptr<Storage> host_buffer(std::size_t bytes) {
  auto storage = std::make_shared<Storage>();
  const std::size_t padded = ((bytes + kBufferAlignment - 1) / kBufferAlignment) * kBufferAlignment;
  storage->data = std::aligned_alloc(kBufferAlignment, padded == 0 ? kBufferAlignment : padded);
  if (!storage->data) fail<Error>("out of host memory allocating ", bytes, " bytes");
  storage->bytes = bytes;
  storage->device = Device::cpu();
  storage->deleter = [](void* p) { std::free(p); };
  return storage;
}

std::shared_ptr<Storage> map_file(const std::string& path, std::size_t min_bytes,
                                  const std::function<std::string(std::size_t)>& too_small) {
  std::FILE* stream = std::fopen(path.c_str(), "rbe");  // "e": close-on-exec
  if (!stream) fail<IoError>(path, ": cannot open: ", errno_text());
  const int fd = ::fileno(stream);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const std::string why = errno_text();
    std::fclose(stream);
    fail<IoError>(path, ": cannot stat: ", why);
  }
  if (!S_ISREG(st.st_mode)) {
    std::fclose(stream);
    fail<IoError>(path, ": not a regular file");
  }
  const std::size_t size = static_cast<std::size_t>(st.st_size);
  if (size < min_bytes) {
    std::fclose(stream);
    fail<IoError>(path, ": ", too_small(size));
  }
  void* base = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  const std::string why = errno_text();
  std::fclose(stream);
  if (base == MAP_FAILED) fail<IoError>(path, ": cannot map ", size, " bytes: ", why);
  auto mapping = std::make_shared<Storage>();
  mapping->data = base;
  mapping->bytes = size;
  mapping->device = Device::cpu();
  mapping->deleter = [size](void* p) { ::munmap(p, size); };
  return mapping;
}

}  // namespace splice
