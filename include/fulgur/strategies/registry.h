// SPDX-License-Identifier: Apache-2.0
#pragma once
// Strategy names -> strategy objects, resolved once from the Trainer's options.

#include <fulgur/strategies/ddp_comm_hook.h>
#include <fulgur/strategies/strategy.h>

#include <torch/arg.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace fulgur {

// What make_strategy builds: the Trainer fills it from its options.
//
// Example:
//   fulgur::make_strategy(fulgur::StrategyRequest().strategy("ddp").devices("2"))
struct StrategyRequest {
  TORCH_ARG(std::string, strategy) = "auto";
  TORCH_ARG(std::string, accelerator) = "auto";
  TORCH_ARG(std::string, devices) = "auto";
  TORCH_ARG(std::string, precision) = "32-true";
  TORCH_ARG(int64_t, num_nodes) = 1;
  TORCH_ARG(std::string, start_method) = "fork";
  // ParallelOptions::max_restarts; more than 0 needs a strategy that starts processes.
  TORCH_ARG(int64_t, max_restarts) = 0;
  TORCH_ARG(std::chrono::milliseconds, collective_timeout) = std::chrono::minutes(30);
  TORCH_ARG(bool, use_distributed_sampler) = true;
  // ParallelOptions::ddp_comm_hook. Anything but kNone is refused with
  // "single_device" and "single_xla" (and "auto" on one device), which reduce
  // nothing; "ddp" or "xla" on one device take it and have nothing to reduce.
  TORCH_ARG(DDPCommHook, ddp_comm_hook) = DDPCommHook::kNone;
};

// The names make_strategy accepts.
std::vector<std::string> strategy_names();

// "auto": xla/ddp on several devices, single_device on one. Throws
// std::invalid_argument naming the bad value and the valid choices (unknown
// names, devices, precision, or a strategy that does not fit the accelerator).
std::shared_ptr<Strategy> make_strategy(const StrategyRequest& request);

}  // namespace fulgur
