// Decision log printing (see decisions.h).
#include "splice/passes/decisions.h"

#include <cmath>
#include <iomanip>
#include <sstream>

namespace splice {

Decision* DecisionLog::find_branch(NodeId branch) {
  for (auto& d : entries_)
    if (d.offered && d.branch == branch) return &d;
  return nullptr;
}

std::string DecisionLog::str() const {
  std::ostringstream out;
  out << std::setprecision(3);
  for (const auto& d : entries_) {
    out << d.kind << " at " << (d.site.empty() ? "?" : d.site) << ": "
        << (d.offered ? "OFFERED" : "DECLINED") << " (" << d.reason << ")";
    if (d.offered) out << " branch %" << d.branch.index;
    if (d.collapsed_to >= 0)
      out << ", collapsed to arm " << d.collapsed_to << " ("
          << (static_cast<std::size_t>(d.collapsed_to) < d.arm_labels.size()
                  ? d.arm_labels[d.collapsed_to]
                  : "?")
          << ")";
    out << "\n";
    for (const auto& b : d.buckets) {
      out << "    bucket [" << b.lo << ", " << b.hi << "]"
          << (b.from_cache ? " (tuning cache)" : "") << ":";
      for (std::size_t arm = 0; arm < b.verified.size(); ++arm) {
        out << "  arm" << arm;
        if (arm < d.arm_labels.size()) out << " " << d.arm_labels[arm];
        out << (b.verified[arm] ? " verified" : " REJECTED");
        if (arm > 0)
          out << " max_abs_err=" << b.max_abs_error[arm] << " max_rel_err=" << b.max_rel_error[arm];
        if (!b.failure[arm].empty()) out << " [" << b.failure[arm] << "]";
        if (arm < b.median_us.size() && !std::isnan(b.median_us[arm]))
          out << " " << b.median_us[arm] << " us";
      }
      out << "  -> arm " << b.winner << " (" << b.reason << ")\n";
    }
  }
  return out.str();
}

}  // namespace splice
