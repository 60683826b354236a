// splice: the command-line front end.
//
//   splice run      generate text with a model (safetensors + config.json, or the embedded default)
//   splice inspect  the graph before and after the optimizer, and every arm decision
//   splice bench    tokens/s, per-token latency p50/p99 and host overhead per token
//   splice op       run one fused op on tensors from a safetensors file (reproduce a mismatch)
// Errors are one clear line on stderr and a non-zero exit.
#include <iostream>
#include <vector>

#include "commands.h"
#include "splice/core/error.h"

int main(int argc, char** argv) {
  CLI::App app{"splice: a decode compiler and runtime for hybrid attention + KDA language models"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "splice 0.1.0");
  std::vector<std::pair<CLI::App*, splice::cli::Runner>> commands;
  auto add = [&](const char* name, const char* help, splice::cli::Runner (*fn)(CLI::App&)) {
    CLI::App* sub = app.add_subcommand(name, help);
    commands.emplace_back(sub, fn(*sub));
  };
  add("run", "Generate tokens with a model (default: the embedded demo model)",
      &splice::cli::add_run);
  add("inspect", "Print the graph before and after optimization and every arm decision",
      &splice::cli::add_inspect);
  add("bench", "Measure tokens/s, per-token latency (p50/p99) and host overhead per token",
      &splice::cli::add_bench);
  add("op", "Run one fused op on tensors from a safetensors file", &splice::cli::add_op);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    for (auto& [sub, run] : commands)
      if (sub->parsed()) return run();
  } catch (const splice::Error& e) {
    std::cerr << "splice: error: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "splice: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
