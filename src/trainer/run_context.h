// SPDX-License-Identifier: Apache-2.0
#pragma once
// RunContext: the running Trainer as the library's module, optimizer wrapper,
// callbacks and strategies see it (private to the library). It reads the
// trainer's state and asks it to act; nothing here writes its fields. The
// public read-only state (epoch, step, should_stop, metrics) is on Trainer.

#include <fulgur/types.h>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace torch::optim {
class Optimizer;
}

namespace fulgur {
class Trainer;
}

namespace fulgur::detail {

class RunContext {
 public:
  virtual ~RunContext() = default;
  // The stage of the current (or last) run; kFit during fit's sanity check too.
  virtual Stage stage() const = 0;
  // LightningModule::log. Throws std::logic_error outside a run, and
  // std::invalid_argument for rank_zero_only with sync_dist.
  virtual void log(const std::string& name, const at::Tensor& value, const LogOptions& options) = 0;
  // LightningOptimizer::step under manual optimization: runs `closure` (if
  // given), syncs gradients and steps through the strategy, and counts the
  // step in global_step.
  virtual void optimizer_step(torch::optim::Optimizer& optimizer, const std::function<void()>& closure) = 0;
  // This rank's predictions of the running (or last) predict, and each
  // prediction's dataset indices (empty when the source is not a DataLoader).
  virtual const std::vector<at::Tensor>& predictions() const = 0;
  virtual const std::vector<std::vector<int64_t>>& predict_batch_indices() const = 0;
};

}  // namespace fulgur::detail
