// SPDX-License-Identifier: Apache-2.0
#pragma once
// What configure_optimizers returns: the optimizers and their learning-rate
// schedulers. Both are held by pointer, so their classes are only declared
// here; the program that makes them includes their headers.

#include <torch/arg.h>

#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace torch::optim {
class Optimizer;
class LRScheduler;
}  // namespace torch::optim

namespace fulgur {

// A learning-rate scheduler and when it steps (Lightning's lr_scheduler_config).
//
// Example:
//   fulgur::SchedulerConfig(std::make_shared<torch::optim::StepLR>(*opt, 10, 0.5)).interval("step")
struct SchedulerConfig {
  explicit SchedulerConfig(std::shared_ptr<torch::optim::LRScheduler> scheduler) : scheduler_(std::move(scheduler)) {}
  TORCH_ARG(std::shared_ptr<torch::optim::LRScheduler>, scheduler);
  // When the scheduler steps: after every `frequency` optimizer steps ("step")
  // or after every `frequency` epochs ("epoch").
  TORCH_ARG(std::string, interval) = "epoch";
  TORCH_ARG(int64_t, frequency) = 1;
  // Which optimizer of OptimizerConfig::optimizers the scheduler drives.
  TORCH_ARG(int64_t, optimizer_index) = 0;
  // Name used by LearningRateMonitor; default "lr-<Optimizer>".
  TORCH_ARG(std::string, name) = "";
  // The logged metric a lr_scheduler::ReduceLROnPlateau steps with (required with one, as in
  // Lightning). strict: a missing metric at a step is an error naming the logged ones; false:
  // the step is skipped with a warning.
  TORCH_ARG(std::string, monitor) = "";
  TORCH_ARG(bool, strict) = true;
};

// What configure_optimizers returns: one or several optimizers and their
// schedulers.
struct OptimizerConfig {
  OptimizerConfig() = default;
  template <typename O, typename = std::enable_if_t<std::is_base_of_v<torch::optim::Optimizer, O>>>
  OptimizerConfig(std::shared_ptr<O> optimizer)  // NOLINT: returning an optimizer is enough, as in Lightning
      : optimizers{std::move(optimizer)} {}
  OptimizerConfig(std::vector<std::shared_ptr<torch::optim::Optimizer>> optimizers,
                  std::vector<SchedulerConfig> schedulers = {});

  std::vector<std::shared_ptr<torch::optim::Optimizer>> optimizers;
  std::vector<SchedulerConfig> schedulers;
};

}  // namespace fulgur
