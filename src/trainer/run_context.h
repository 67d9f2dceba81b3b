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
class Callback;
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
  // Runs up to `max_steps` optimizer steps of the running fit from its first batch, with `probe`
  // as the only callback and no loggers, validation, checkpoints or scheduler steps, and then
  // puts the fit back where it was: the weights (bit for bit), the loop counters, the CPU and xla
  // generators, the precision plugin's state, and optimizers and schedulers made anew by
  // configure_optimizers. Lightning's nested fit_loop.run() in _lr_find (LearningRateFinder).
  // Every rank calls. REQUIRES: during on_fit_start of a fit at global step 0.
  virtual void run_probe(Callback& probe, int64_t max_steps) = 0;
  // The module's configure_optimizers again (its schedulers' step counts back at 0), after the
  // module changed what they are made from. Every rank calls. REQUIRES: fit, before its first step.
  virtual void reconfigure_optimizers() = 0;
};

}  // namespace fulgur::detail
