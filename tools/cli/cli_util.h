// Helpers shared by the CLI subcommands: device parsing, a progress bar, JSON of decisions.
#pragma once

#include <chrono>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "splice/core/tensor.h"
#include "splice/passes/decisions.h"

namespace splice::cli {

// "cpu", "cuda" or "cuda:N"; throws ValueError naming --device otherwise (and DeviceError when
// CUDA is asked for but unavailable).
Device parse_device(const std::string& name);

nlohmann::json decisions_json(const DecisionLog& log);

// A one-line progress indicator on a terminal stream (nothing when `out` is null).
class ProgressBar {
 public:
  // Draws only when `out` is a terminal (stderr), so logs and pipes stay clean.
  explicit ProgressBar(std::ostream* out);
  void tick(const std::string& what);
  void done();

 private:
  std::ostream* out_;
  std::chrono::steady_clock::time_point start_;
  int count_ = 0;
  bool dirty_ = false;
};

}  // namespace splice::cli
