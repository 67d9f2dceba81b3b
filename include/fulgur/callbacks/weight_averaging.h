// SPDX-License-Identifier: Apache-2.0
#pragma once
// WeightAveraging: keeps an average of the module's weights over training
// (Lightning's WeightAveraging, torch's AveragedModel), and EMAWeightAveraging,
// its exponential moving average.
//
// The averaged copy is made at fit's setup from the module's weights and
// updated after optimizer steps (should_update decides which). Validation
// runs on the averaged weights (swapped in for the run and out after it);
// when training ends they replace the module's own, so test, predict and a
// checkpoint saved after fit use them. Every checkpoint fit writes holds the
// averaged weights under "state_dict" (what load_from_checkpoint, validate,
// test and predict read), the module's own under "current_model_state" and
// the update count under "averaging_state", as Lightning's; a resumed fit
// restores both copies and continues the average exactly.
//
// Example:
//   auto ema = std::make_shared<fulgur::EMAWeightAveraging>(
//       fulgur::EMAWeightAveragingOptions().decay(0.999).update_starting_at_step(100));
//   fulgur::Trainer trainer(fulgur::TrainerOptions().callbacks({ema}));

#include <fulgur/callbacks/callback.h>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <torch/arg.h>

#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace fulgur {

// The new averaged value of one tensor from the averaged one, the module's
// current one and how many updates the average holds so far (>= 1).
using AveragingFn =
    std::function<at::Tensor(const at::Tensor& averaged, const at::Tensor& current, int64_t num_averaged)>;

// torch.optim.swa_utils.get_ema_avg_fn: decay * averaged + (1 - decay) * current.
// Throws std::invalid_argument unless 0 <= decay <= 1.
AveragingFn ema_avg_fn(double decay = 0.999);

struct WeightAveragingOptions {
  // How each update folds the module's weights in; unset: the equal average of
  // every update (stochastic weight averaging), averaged + (current - averaged) / (n + 1).
  TORCH_ARG(AveragingFn, avg_fn) = nullptr;
  // Average the floating-point buffers too (BatchNorm's running statistics);
  // false: the copy's buffers follow the module's. Integer buffers (a batch
  // count) are copied either way, since an average of counts is not a count.
  TORCH_ARG(bool, use_buffers) = true;
  // Where the averaged copy lives; unset: the module's device. "cpu" saves
  // accelerator memory at the price of a copy per update.
  TORCH_ARG(std::optional<c10::Device>, device) = std::nullopt;
};

class WeightAveraging : public Callback {
 public:
  explicit WeightAveraging(WeightAveragingOptions options = WeightAveragingOptions());
  std::string state_key() const override { return "WeightAveraging"; }

  // Called after every optimizer step with its zero-based index (step_idx,
  // epoch_idx unset) and after every training epoch with the epoch's
  // (epoch_idx set): whether to update the average then. Default: after
  // every step, never at epoch end.
  virtual bool should_update(std::optional<int64_t> step_idx, std::optional<int64_t> epoch_idx) const;

  void setup(Trainer&, LightningModule&, Stage stage) override;
  void on_train_batch_end(Trainer&, LightningModule&, const StepOutput&, const Batch&, int64_t) override;
  void on_train_epoch_end(Trainer&, LightningModule&) override;
  void on_train_end(Trainer&, LightningModule&) override;
  void on_validation_epoch_start(Trainer&, LightningModule&) override;
  void on_validation_epoch_end(Trainer&, LightningModule&) override;
  void on_save_checkpoint(Trainer&, LightningModule&, Checkpoint&) override;
  void on_load_checkpoint(Trainer&, LightningModule&, const Checkpoint&) override;
  c10::IValue state_dict() const override;
  void load_state_dict(const c10::IValue& state) override;

  // The averaged parameters and buffers, by the module's dotted names (empty
  // before fit's setup). During a validation run inside fit they hold the
  // module's own weights, which are swapped out.
  const std::vector<std::pair<std::string, at::Tensor>>& averaged() const { return averaged_; }
  // Updates folded into the average so far.
  int64_t num_averaged() const { return num_averaged_; }

 private:
  void update(LightningModule& module);
  void swap(LightningModule& module);
  WeightAveragingOptions options_;
  std::vector<std::pair<std::string, at::Tensor>> averaged_;
  int64_t num_averaged_ = 0;
  // The running stage is fit: validation swaps the average in.
  bool fitting_ = false;
  // global_step at the last update: one update per optimizer step, the first
  // after the first step (after k batches with accumulate_grad_batches=k).
  int64_t latest_update_step_ = 0;
  // Epoch of the last epoch-end update; -1: none yet.
  int64_t latest_update_epoch_ = -1;
};

struct EMAWeightAveragingOptions {
  // Weight of the old average at each update.
  TORCH_ARG(double, decay) = 0.999;
  // Update after every n-th optimizer step (step_idx % n == 0); must be >= 1.
  TORCH_ARG(int64_t, update_every_n_steps) = 1;
  // Update only from this step index on (unset: from the first).
  TORCH_ARG(std::optional<int64_t>, update_starting_at_step) = std::nullopt;
  // Also update at the end of each epoch from this epoch on (unset: never at epoch end).
  TORCH_ARG(std::optional<int64_t>, update_starting_at_epoch) = std::nullopt;
  TORCH_ARG(bool, use_buffers) = true;
  TORCH_ARG(std::optional<c10::Device>, device) = std::nullopt;
};

// Lightning's EMAWeightAveraging: WeightAveraging with ema_avg_fn(decay) and
// the update schedule of its options. Bad options throw std::invalid_argument
// naming the value and the allowed range.
class EMAWeightAveraging : public WeightAveraging {
 public:
  explicit EMAWeightAveraging(EMAWeightAveragingOptions options = EMAWeightAveragingOptions());
  std::string state_key() const override { return "EMAWeightAveraging"; }
  bool should_update(std::optional<int64_t> step_idx, std::optional<int64_t> epoch_idx) const override;
  const EMAWeightAveragingOptions& options() const { return ema_options_; }

 private:
  EMAWeightAveragingOptions ema_options_;
};

}  // namespace fulgur
