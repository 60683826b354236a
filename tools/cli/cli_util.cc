// CLI helpers (see cli_util.h).
#include "cli_util.h"

#include <unistd.h>

#include <cmath>

#include "splice/core/error.h"

#ifdef SPLICE_WITH_CUDA
#include "splice/backend/cuda/runtime.h"
#endif

namespace splice::cli {

Device parse_device(const std::string& name) {
  if (name == "cpu") return Device::cpu();
  if (name == "cuda" || name.rfind("cuda:", 0) == 0) {
    int index = 0;
    if (name.size() > 5) {
      try {
        index = std::stoi(name.substr(5));
      } catch (const std::exception&) {
        fail<ValueError>("--device must be cpu, cuda or cuda:N, got '", name, "'");
      }
    }
#ifdef SPLICE_WITH_CUDA
    if (!cuda::device_available())
      fail<DeviceError>("--device ", name, ": no CUDA device is available");
    cuda::ensure_registered();
    return Device::cuda(index);
#else
    (void)index;
    fail<DeviceError>("--device ", name, ": this build has no CUDA backend");
#endif
  }
  fail<ValueError>("--device must be cpu, cuda or cuda:N, got '", name, "'");
}

nlohmann::json decisions_json(const DecisionLog& log) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& d : log.entries()) {
    nlohmann::json j;
    j["kind"] = d.kind;
    j["site"] = d.site;
    j["offered"] = d.offered;
    j["reason"] = d.reason;
    j["arms"] = d.arm_labels;
    j["collapsed_to"] = d.collapsed_to;
    for (const auto& b : d.buckets) {
      nlohmann::json jb;
      jb["lo"] = b.lo;
      jb["hi"] = b.hi;
      jb["winner"] = b.winner;
      jb["reason"] = b.reason;
      jb["from_cache"] = b.from_cache;
      for (std::size_t a = 0; a < b.verified.size(); ++a) {
        jb["verified"].push_back(static_cast<bool>(b.verified[a]));
        jb["max_abs_error"].push_back(b.max_abs_error[a]);
        jb["max_rel_error"].push_back(b.max_rel_error[a]);
        jb["failure"].push_back(b.failure[a]);
        jb["median_us"].push_back(std::isnan(b.median_us[a]) ? nlohmann::json()
                                                             : nlohmann::json(b.median_us[a]));
      }
      j["buckets"].push_back(jb);
    }
    out.push_back(j);
  }
  return out;
}

ProgressBar::ProgressBar(std::ostream* out)
    : out_(out != nullptr && isatty(STDERR_FILENO) ? out : nullptr),
      start_(std::chrono::steady_clock::now()) {}

void ProgressBar::tick(const std::string& what) {
  if (!out_) return;
  ++count_;
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  *out_ << "\r\033[K[" << count_ << " | " << static_cast<int>(seconds) << "s] " << what
        << std::flush;
  dirty_ = true;
}

void ProgressBar::done() {
  if (out_ && dirty_) *out_ << "\r\033[K" << std::flush;
  dirty_ = false;
}

}  // namespace splice::cli
