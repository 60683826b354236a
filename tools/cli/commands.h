// The splice CLI's subcommands; each registers its options on a CLI11 subcommand and returns the
// function that runs it (exit code).
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace splice::cli {

using Runner = std::function<int()>;

Runner add_inspect(CLI::App& app);
Runner add_op(CLI::App& app);
Runner add_run(CLI::App& app);
Runner add_bench(CLI::App& app);

// Parses a device name ("cpu", "cuda", "cuda:1").
struct DeviceArg {
  std::string name = "cpu";
};

}  // namespace splice::cli
