// SPDX-License-Identifier: Apache-2.0
#pragma once
// LightningModule: a torch::nn::Module that also says how it trains.
//
// Example:
//   struct Net : fulgur::LightningModule {
//     Net() { fc = register_module("fc", torch::nn::Linear(784, 10)); }
//     fulgur::StepOutput training_step(const fulgur::Batch& b, int64_t) override {
//       auto loss = torch::nll_loss(torch::log_softmax(fc(b.data.flatten(1)), 1), b.target);
//       log("train_loss", loss, fulgur::LogOptions().prog_bar(true));
//       return loss;
//     }
//     fulgur::OptimizerConfig configure_optimizers() override {
//       return std::make_shared<torch::optim::SGD>(parameters(), 0.1);
//     }
//     torch::nn::Linear fc{nullptr};
//   };

#include <fulgur/checkpoint.h>
#include <fulgur/optimizer_config.h>
#include <fulgur/types.h>

#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace fulgur {

class Trainer;
namespace detail {
struct TrainerImpl;
}

// An optimizer as a module sees it under manual optimization: step() goes
// through the strategy (gradient sync, precision, step mark on xla devices).
class LightningOptimizer {
 public:
  LightningOptimizer(Trainer* trainer, std::shared_ptr<torch::optim::Optimizer> optimizer)
      : trainer_(trainer), optimizer_(std::move(optimizer)) {}
  void zero_grad() { optimizer_->zero_grad(); }
  // Runs `closure` (if given), syncs gradients across ranks, steps.
  void step(const std::function<void()>& closure = nullptr);
  torch::optim::Optimizer& optimizer() { return *optimizer_; }

 private:
  Trainer* trainer_;
  std::shared_ptr<torch::optim::Optimizer> optimizer_;
};

class LightningModule : public torch::nn::Module {
 public:
  explicit LightningModule(std::string name = "LightningModule");
  ~LightningModule() override;

  // --- Steps -------------------------------------------------------------
  // REQUIRES under automatic optimization: returns a loss (or a dict with "loss").
  virtual StepOutput training_step(const Batch& batch, int64_t batch_idx) = 0;
  virtual StepOutput validation_step(const Batch& batch, int64_t batch_idx);
  virtual StepOutput test_step(const Batch& batch, int64_t batch_idx);
  // Default: throws, naming the module, because there is no generic forward.
  virtual at::Tensor predict_step(const Batch& batch, int64_t batch_idx);
  virtual OptimizerConfig configure_optimizers() = 0;

  // --- Hooks (called on every rank) ----------------------------------------
  virtual void on_fit_start() {}
  virtual void on_fit_end() {}
  virtual void on_train_epoch_start() {}
  virtual void on_train_epoch_end() {}
  virtual void on_train_batch_start(const Batch& /*batch*/, int64_t /*batch_idx*/) {}
  virtual void on_train_batch_end(const StepOutput& /*out*/, const Batch& /*batch*/,
                                  int64_t /*batch_idx*/) {}
  virtual void on_validation_epoch_start() {}
  virtual void on_validation_epoch_end() {}
  virtual void on_test_epoch_end() {}
  // After gradients are synced and before clipping and optimizer.step().
  virtual void on_before_optimizer_step(torch::optim::Optimizer& /*optimizer*/) {}
  // Add or read entries of the checkpoint dict.
  virtual void on_save_checkpoint(Checkpoint& /*checkpoint*/) {}
  virtual void on_load_checkpoint(const Checkpoint& /*checkpoint*/) {}

  // --- Logging -------------------------------------------------------------
  // Records a scalar for the progress bar, the logger and callback_metrics.
  // REQUIRES: called from a step or hook while a Trainer runs; `value` holds
  // one element.
  void log(const std::string& name, const at::Tensor& value, LogOptions options = {});
  void log(const std::string& name, double value, LogOptions options = {});
  // Lightning's log_dict: log(name, value, options) for each entry, in key
  // order. Example: log_dict({{"loss", loss}, {"acc", acc}}, LogOptions().prog_bar(true));
  void log_dict(const std::map<std::string, at::Tensor>& values, const LogOptions& options = {});
  void log_dict(const std::map<std::string, double>& values, const LogOptions& options = {});
  // The same, each name with `prefix` in front (as a MetricCollection's prefix: "val/").
  void log_dict(const std::map<std::string, at::Tensor>& values, const LogOptions& options, const std::string& prefix);
  void log_dict(const std::map<std::string, double>& values, const LogOptions& options, const std::string& prefix);
  // Lightning's self.print: prints `text` and a newline on stdout on global rank 0 only.
  void print(const std::string& text) const;

  // --- Collectives ---------------------------------------------------------
  // Lightning's self.all_gather: every rank's `tensor` stacked into
  // [world_size, *shape] on this rank's device; on one process `tensor`
  // itself, as Lightning's. With sync_grads the backward sums each rank's
  // gradient into the rank that gave the slice. Every rank must call.
  at::Tensor all_gather(const at::Tensor& tensor, bool sync_grads = false);

  // --- Manual optimization -------------------------------------------------
  // With false, training_step drives the optimizers itself through
  // optimizers() and manual_backward().
  void set_automatic_optimization(bool value) { automatic_optimization_ = value; }
  bool automatic_optimization() const { return automatic_optimization_; }
  std::vector<LightningOptimizer> optimizers();
  void manual_backward(const at::Tensor& loss);

  // --- State ---------------------------------------------------------------
  // Recorded in hparams.yaml and in the checkpoint's "hyper_parameters".
  void save_hyperparameters(c10::Dict<std::string, c10::IValue> hparams) { hparams_ = std::move(hparams); }
  const c10::Dict<std::string, c10::IValue>& hparams() const { return hparams_; }
  // nullptr outside Trainer calls.
  Trainer* trainer() const { return trainer_; }
  int64_t current_epoch() const;
  int64_t global_step() const;
  // Where this process stands (0, 0 and 1 outside a Trainer run).
  int64_t global_rank() const;
  int64_t local_rank() const;
  int64_t world_size() const;
  // The device the parameters live on.
  c10::Device device() const;

 private:
  // Sets trainer_ for the duration of a run.
  friend struct detail::TrainerImpl;
  Trainer* trainer_ = nullptr;
  bool automatic_optimization_ = true;
  c10::Dict<std::string, c10::IValue> hparams_ = make_dict();
};

}  // namespace fulgur
