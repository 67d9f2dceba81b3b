// SPDX-License-Identifier: Apache-2.0
#pragma once
// One training batch's optimization, automatic or manual (Lightning's
// loops/optimization/automatic.py and manual.py). The training-epoch loop
// (training_epoch_loop.h) holds one of each and runs the one the module asks for.

#include <fulgur/types.h>

#include <cstdint>
#include <functional>

namespace torch::optim {
class Optimizer;
}

namespace fulgur::detail {

struct TrainerImpl;

// training_step, backward of its loss (divided by the accumulation count), and every
// accumulate_grad_batches micro-batches (or at the epoch's last) the optimizer step with
// on_before_optimizer_step, gradient clipping and zeroing the gradients.
class AutomaticOptimization {
 public:
  explicit AutomaticOptimization(TrainerImpl& trainer) : t_(trainer) {}

  // What run did: training_step's output, and whether the optimizer stepped.
  struct Result {
    StepOutput output;
    bool stepped = false;
  };
  // Runs batch `batch_idx`; `last`: the epoch's last batch, which steps whatever was
  // accumulated. Counts the micro-batch in progress.accumulated and an optimizer step in
  // progress.global_step. Throws std::runtime_error when training_step returns no loss.
  Result run(const Batch& batch, int64_t batch_idx, bool last);

  // Micro-batches per optimizer step: the option, set at each stage's start, or what a
  // GradientAccumulationScheduler set for the epoch. REQUIRES: k >= 1 (Trainer checks).
  int64_t accumulate_grad_batches() const { return accumulate_grad_batches_; }
  void set_accumulate_grad_batches(int64_t k) { accumulate_grad_batches_ = k; }

  // Whether training_step is running (LightningModule::log's on_step/on_epoch defaults).
  bool in_training_step() const { return in_training_step_; }

 private:
  // The closure (training_step and backward) and, when `sync_now`, the optimizer step.
  void step(const Batch& batch, int64_t batch_idx, StepOutput& out, bool sync_now);
  void clip_gradients(torch::optim::Optimizer& optimizer);

  TrainerImpl& t_;
  int64_t accumulate_grad_batches_ = 1;
  bool in_training_step_ = false;
};

// training_step alone: the module steps its optimizers itself, through
// LightningOptimizer::step (RunContext::optimizer_step), each step counted in global_step.
class ManualOptimization {
 public:
  explicit ManualOptimization(TrainerImpl& trainer) : t_(trainer) {}

  StepOutput run(const Batch& batch, int64_t batch_idx);
  // One optimizer step through the strategy (`closure`, if given, runs first).
  void optimizer_step(torch::optim::Optimizer& optimizer, const std::function<void()>& closure);
  bool in_training_step() const { return in_training_step_; }

 private:
  TrainerImpl& t_;
  bool in_training_step_ = false;
};

}  // namespace fulgur::detail
