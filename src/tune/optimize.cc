// The optimizer driver (see optimize.h).
#include "splice/tune/optimize.h"

#include <iostream>

#include "splice/core/debug.h"
#include "splice/ops/decode_attention.h"
#include "splice/ops/kda_decode.h"
#include "splice/ops/layer_ops.h"

namespace splice {

const AttentionContract& flash_decode_contract_for(Device device) {
  return device.is_cpu() ? cpu_flash_decode_contract() : cuda_flash_decode_contract();
}

const KdaContract& kda_contract_for(Device device) {
  return device.is_cpu() ? cpu_kda_contract() : cuda_kda_contract();
}

const LayerOpContract& layer_ops_contract_for(Device device) {
  return device.is_cpu() ? cpu_layer_ops_contract() : cuda_layer_ops_contract();
}

DecisionLog optimize_graph(Graph& graph, const std::vector<DecodeFlashSpec>& attention_specs,
                           const OptimizeOptions& options,
                           const std::vector<KdaDecodeSpec>& kda_specs,
                           const std::vector<LayerOpSpec>& layer_specs) {
  DecisionLog log;
  const int debug = debug_level();
  auto after = [&](const char* stage) {
    verify_graph(graph);
    if (debug >= 2) std::cerr << "[splice] IR after " << stage << ":\n" << print_graph(graph);
  };
  const AttentionContract& contract = flash_decode_contract_for(options.tune.device);
  for (const auto& spec : attention_specs) offer_decode_flash_arm(graph, spec, contract, &log);
  after("offer_decode_flash_arm");
  for (const auto& spec : kda_specs)
    offer_kda_arm(graph, spec, kda_contract_for(options.tune.device), &log);
  after("offer_kda_arm");
  for (const auto& spec : layer_specs)
    offer_layer_op_arm(graph, spec, layer_ops_contract_for(options.tune.device), &log);
  if (!layer_specs.empty()) after("offer_layer_op_arm");
  if (options.select) {
    select_arms(graph, log, options.tune);
    after("select_arms");
  }
  eliminate_dead_code(graph);
  after("eliminate_dead_code");
  if (debug >= 1) std::cerr << "[splice] decisions:\n" << log.str();
  return log;
}

}  // namespace splice
