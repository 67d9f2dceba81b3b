#pragma once
// Strategy names -> strategy objects, resolved once from the Trainer's options.

#include <fulgur/strategies/strategy.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace fulgur {

struct StrategyRequest {
  std::string strategy = "auto";
  std::string accelerator = "auto";
  std::string devices = "auto";
  std::string precision = "32-true";
  int64_t num_nodes = 1;
  std::string start_method = "fork";
  std::chrono::milliseconds collective_timeout{std::chrono::minutes(30)};
  bool use_distributed_sampler = true;
};

// The names make_strategy accepts.
std::vector<std::string> strategy_names();

// "auto": xla/ddp on several devices, single_device on one. Throws
// std::invalid_argument naming the bad value and the valid choices (unknown
// names, devices, precision, or a strategy that does not fit the accelerator).
std::shared_ptr<Strategy> make_strategy(const StrategyRequest& request);

}  // namespace fulgur
