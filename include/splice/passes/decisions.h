// splice/passes/decisions.h: the record of every optimizer decision, queryable and printable.
//
// Each offer appends an entry (offered / declined and why). Arm selection later fills in, per
// length bucket, the verification error of each arm, the timings and the winner. The CLI prints
// it (`splice inspect`), SPLICE_DEBUG=1 logs it, and --json serializes it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "splice/ir/graph.h"

namespace splice {

struct BucketDecision {
  std::int64_t lo = 0, hi = 0;                       // selector range
  std::vector<bool> verified;                        // [arm]
  std::vector<double> max_abs_error, max_rel_error;  // [arm] vs the oracle (arm 0: 0)
  std::vector<std::string> failure;  // [arm] why verification failed ("" if it passed)
  std::vector<double> median_us;     // [arm] (NaN: not timed)
  int winner = 0;
  bool from_cache = false;
  std::string reason;  // "fastest verified", "tie keeps arm 0", ...
};

struct Decision {
  std::string kind;  // "flash_decode", "kda_decode"
  std::string site;  // e.g. "layer3.attn"
  bool offered = false;
  std::string reason;  // why declined, or which contract accepted it
  NodeId branch;       // valid when offered
  std::vector<std::string> arm_labels;
  std::vector<BucketDecision> buckets;
  int collapsed_to = -1;  // the arm a unanimous branch was collapsed to (-1: kept)
};

class DecisionLog {
 public:
  Decision& add(Decision d) {
    entries_.push_back(std::move(d));
    return entries_.back();
  }
  std::vector<Decision>& entries() { return entries_; }
  const std::vector<Decision>& entries() const { return entries_; }
  Decision* find_branch(NodeId branch);
  std::string str() const;  // a readable table

 private:
  std::vector<Decision> entries_;
};

}  // namespace splice
