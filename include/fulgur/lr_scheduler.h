// SPDX-License-Identifier: Apache-2.0
#pragma once
// Learning-rate schedules with PyTorch's (Python's) semantics, as torch.optim.lr_scheduler
// defines them, for configure_optimizers (SchedulerConfig takes them like any
// torch::optim::LRScheduler). A Python scheduler steps once when it is made (last_epoch 0: the
// optimizer's rate becomes the schedule's first value) and its k-th step() sets the value of
// epoch k; libtorch's own torch::optim::StepLR decays one step later than Python's, so a
// schedule ported from Python with it is not the same schedule.
//
// Each rate is computed from the optimizer's rates when the scheduler was made (Python's
// initial_lr, one per parameter group) and the step count, so a resumed run (the Trainer restores
// the count from the checkpoint) continues the uninterrupted run's schedule exactly.
//
// Example (StepLR: 0.1, 0.1, 0.05, 0.05, 0.025, ... over the epochs):
//   auto opt = std::make_shared<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.1));
//   auto sched = std::make_shared<fulgur::lr_scheduler::StepLR>(*opt, /*step_size=*/2, /*gamma=*/0.5);
//   return fulgur::OptimizerConfig({opt}, {fulgur::SchedulerConfig(sched)});
//
// Every constructor throws std::invalid_argument naming a value Python refuses (and what is
// allowed).

#include <torch/arg.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/schedulers/lr_scheduler.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace fulgur::lr_scheduler {

// The base of the schedules here: lrs_at(epoch) is the schedule; step() sets epoch
// step_count + 1.
class Schedule : public torch::optim::LRScheduler {
 public:
  // The rates of epoch `epoch` (0: the rates set when the scheduler was made), one per group.
  virtual std::vector<double> lrs_at(int64_t epoch) const = 0;
  // The optimizer's rates when the scheduler was made (Python's initial_lr).
  const std::vector<double>& base_lrs() const { return base_lrs_; }
  // The epoch of the rates in force: the number of step() calls.
  int64_t last_epoch() const { return step_count_; }

 protected:
  explicit Schedule(torch::optim::Optimizer& optimizer);
  // Sets the optimizer to lrs_at(0): the step Python's constructor takes. Subclasses call it
  // last in their constructor.
  void initial_step();
  std::vector<double> get_lrs() override;
  torch::optim::Optimizer& optimizer_;
  std::vector<double> base_lrs_;

 private:
  friend class SequentialLR;  // gives its schedulers one set of initial rates, as Python's initial_lr
};

// base * gamma ^ floor(epoch / step_size).
class StepLR : public Schedule {
 public:
  StepLR(torch::optim::Optimizer& optimizer, int64_t step_size, double gamma = 0.1);
  std::vector<double> lrs_at(int64_t epoch) const override;

 private:
  int64_t step_size_;
  double gamma_;
};

// base * gamma ^ (the milestones <= epoch, counted with repeats).
class MultiStepLR : public Schedule {
 public:
  MultiStepLR(torch::optim::Optimizer& optimizer, std::vector<int64_t> milestones, double gamma = 0.1);
  std::vector<double> lrs_at(int64_t epoch) const override;

 private:
  std::vector<int64_t> milestones_;
  double gamma_;
};

// base * gamma ^ epoch.
class ExponentialLR : public Schedule {
 public:
  ExponentialLR(torch::optim::Optimizer& optimizer, double gamma);
  std::vector<double> lrs_at(int64_t epoch) const override;

 private:
  double gamma_;
};

// eta_min + (base - eta_min) * (1 + cos(pi * epoch / T_max)) / 2 (periodic past T_max, as
// Python's recursive form).
class CosineAnnealingLR : public Schedule {
 public:
  CosineAnnealingLR(torch::optim::Optimizer& optimizer, int64_t T_max, double eta_min = 0.0);
  std::vector<double> lrs_at(int64_t epoch) const override;

 private:
  int64_t t_max_;
  double eta_min_;
};

// Linear warm-up (or decay) of the factor from start_factor to end_factor over total_iters
// epochs, then end_factor.
class LinearLR : public Schedule {
 public:
  LinearLR(torch::optim::Optimizer& optimizer, double start_factor = 1.0 / 3, double end_factor = 1.0,
           int64_t total_iters = 5);
  std::vector<double> lrs_at(int64_t epoch) const override;

 private:
  double start_factor_, end_factor_;
  int64_t total_iters_;
};

// base * lambda(epoch).
class LambdaLR : public Schedule {
 public:
  LambdaLR(torch::optim::Optimizer& optimizer, std::function<double(int64_t)> lr_lambda);
  std::vector<double> lrs_at(int64_t epoch) const override;

 private:
  std::function<double(int64_t)> lambda_;
};

// The 1cycle policy: from max_lr / div_factor up to max_lr over pct_start of total_steps, then
// down to max_lr / (div_factor * final_div_factor) ("cos" or "linear" annealing; three_phase as
// Python's). With cycle_momentum the momentum (SGD) or beta1 (Adam, AdamW) moves inversely
// between max_momentum and base_momentum. Stepping past total_steps throws, as Python does.
struct OneCycleOptions {
  TORCH_ARG(double, pct_start) = 0.3;
  TORCH_ARG(std::string, anneal_strategy) = "cos";
  TORCH_ARG(bool, cycle_momentum) = true;
  TORCH_ARG(double, base_momentum) = 0.85;
  TORCH_ARG(double, max_momentum) = 0.95;
  TORCH_ARG(double, div_factor) = 25.0;
  TORCH_ARG(double, final_div_factor) = 1e4;
  TORCH_ARG(bool, three_phase) = false;
};
class OneCycleLR : public Schedule {
 public:
  OneCycleLR(torch::optim::Optimizer& optimizer, double max_lr, int64_t total_steps, OneCycleOptions options = {});
  std::vector<double> lrs_at(int64_t epoch) const override;
  // The momentum (or beta1) of epoch `epoch`; only with cycle_momentum.
  double momentum_at(int64_t epoch) const;

 protected:
  std::vector<double> get_lrs() override;

 private:
  struct Phase {
    double end_step;
    double start_lr, end_lr;  // factors of max_lr
    double start_momentum, end_momentum;
  };
  std::pair<const Phase*, double> phase_at(int64_t epoch) const;
  double anneal(double start, double end, double pct) const;
  void set_momentum(double momentum);
  double max_lr_;
  int64_t total_steps_;
  OneCycleOptions options_;
  std::vector<Phase> phases_;
};

// schedulers[i] from milestones[i-1] on, counting its epochs from 0 there (Python's
// SequentialLR restarts each scheduler at its milestone). The schedulers must drive
// `optimizer`; they are used only through lrs_at, never stepped themselves.
class SequentialLR : public Schedule {
 public:
  SequentialLR(torch::optim::Optimizer& optimizer, std::vector<std::shared_ptr<Schedule>> schedulers,
               std::vector<int64_t> milestones);
  std::vector<double> lrs_at(int64_t epoch) const override;

 private:
  std::vector<std::shared_ptr<Schedule>> schedulers_;
  std::vector<int64_t> milestones_;
};

// Python's ReduceLROnPlateau: when the monitored value has not improved (by `threshold`,
// relative or absolute) for more than `patience` steps, every group's rate is multiplied by
// `factor` (not below `min_lr`; changes smaller than `eps` are skipped), then `cooldown` steps
// pass before bad steps count again. It steps with a value: step(metric). The Trainer steps it
// with SchedulerConfig::monitor's logged value, as Lightning does (SchedulerConfig::monitor is
// required with it), and keeps its state in checkpoints.
struct ReduceLROnPlateauOptions {
  TORCH_ARG(std::string, mode) = "min";
  TORCH_ARG(double, factor) = 0.1;
  TORCH_ARG(int64_t, patience) = 10;
  TORCH_ARG(double, threshold) = 1e-4;
  TORCH_ARG(std::string, threshold_mode) = "rel";
  TORCH_ARG(int64_t, cooldown) = 0;
  TORCH_ARG(double, min_lr) = 0.0;
  TORCH_ARG(double, eps) = 1e-8;
};
class ReduceLROnPlateau : public torch::optim::LRScheduler {
 public:
  explicit ReduceLROnPlateau(torch::optim::Optimizer& optimizer, ReduceLROnPlateauOptions options = {});
  // One step with the monitored value (NaN counts as no improvement, as in Python).
  void step(double metric);
  using torch::optim::LRScheduler::step;  // throws: this scheduler needs the value
  double best() const { return best_; }
  int64_t num_bad_epochs() const { return num_bad_epochs_; }
  int64_t cooldown_counter() const { return cooldown_counter_; }
  int64_t last_epoch() const { return last_epoch_; }
  const ReduceLROnPlateauOptions& options() const { return options_; }
  // Restores what a checkpoint keeps (Python's state_dict keys best, num_bad_epochs,
  // cooldown_counter, last_epoch); throws std::invalid_argument for a negative count.
  void restore(double best, int64_t num_bad_epochs, int64_t cooldown_counter, int64_t last_epoch);

 protected:
  std::vector<double> get_lrs() override;

 private:
  bool is_better(double value) const;
  torch::optim::Optimizer& optimizer_;
  ReduceLROnPlateauOptions options_;
  double best_;
  int64_t num_bad_epochs_ = 0;
  int64_t cooldown_counter_ = 0;
  int64_t last_epoch_ = 0;
};

}  // namespace fulgur::lr_scheduler
