// SPDX-License-Identifier: Apache-2.0
#pragma once
// lr_find and LearningRateFinder: the learning-rate range test, as a function run before fit
// (Lightning's Tuner.lr_find) and as a callback run inside fit (Lightning's
// callbacks.LearningRateFinder).
//
// lr_find: the learning-rate range test (Lightning's Tuner.lr_find). It trains
// the module for up to num_training optimizer steps while the learning rate
// of every parameter group grows from min_lr to max_lr, records the smoothed
// training loss at each rate, stops early once the loss diverges, and then
// puts the module's weights back as they were (bit for bit). The suggestion
// is the rate where the smoothed loss falls fastest.
//
// The test runs in a Trainer of its own, made from the given Trainer's options
// with no callbacks, loggers, checkpoints, validation or progress bar; the
// optimizers and schedulers come from configure_optimizers as in fit, and a
// scheduler of the module's is overruled by the range test's rate at every
// step. It runs in this process: a strategy that starts processes is refused.
//
// The curve is written as CSV with the columns step, lr, loss (one row per
// point), which fulgur-plot draws against step:
//   fulgur-plot lr_find.csv -o lr_find.png
//
// Example:
//   fulgur::Trainer trainer(fulgur::TrainerOptions().max_epochs(10));
//   fulgur::LRFinderResult found = fulgur::lr_find(trainer, model, datamodule);
//   if (auto lr = found.suggestion()) model.lr = *lr;   // the module's own field
//   trainer.fit(model, datamodule);

#include <fulgur/callbacks/callback.h>
#include <fulgur/trainer.h>

#include <torch/arg.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace fulgur {

class BatchSource;
class DataModule;
class LightningModule;

struct LRFinderOptions {
  // The rates tried: from min_lr (> 0) to max_lr (> min_lr).
  TORCH_ARG(double, min_lr) = 1e-8;
  TORCH_ARG(double, max_lr) = 1.0;
  // Optimizer steps of the test, one point each (>= 1).
  TORCH_ARG(int64_t, num_training) = 100;
  // How the rate grows: "exponential" or "linear".
  TORCH_ARG(std::string, mode) = "exponential";
  // Stop once the smoothed loss exceeds this multiple of the best one so far
  // (> 0); unset: run every step.
  TORCH_ARG(std::optional<double>, early_stop_threshold) = 4.0;
  // Weight of the past in the smoothed loss, in [0, 1).
  TORCH_ARG(double, beta) = 0.98;
  // Where the curve goes; "": <default_root_dir>/lr_find.csv. Rank 0 writes it.
  TORCH_ARG(std::string, csv_path) = "";
};

struct LRFinderResult {
  // The rate of each optimizer step and the smoothed loss after it.
  std::vector<double> lrs;
  std::vector<double> losses;
  std::string mode;
  // The CSV written ("" when nothing was run).
  std::string csv_path;
  // The point of steepest descent of the smoothed loss (torch.gradient against
  // the rate, or against log10 of the rate in exponential mode), leaving out the
  // first skip_begin and the last skip_end points and those that are not
  // finite; unset with fewer than two points left. As Lightning's
  // _LRFinder.suggestion, with the log spacing of its pull request #21171.
  std::optional<int64_t> optimal_index(int64_t skip_begin = 10, int64_t skip_end = 1) const;
  std::optional<double> suggestion(int64_t skip_begin = 10, int64_t skip_end = 1) const;
};

// Runs the range test on `model` with the training batches of `train_loader`
// (or of the DataModule's train_dataloader). Bad options throw
// std::invalid_argument naming the value and what is allowed; under
// fast_dev_run nothing is run (a warning, and an empty result), as in Lightning.
LRFinderResult lr_find(const Trainer& trainer, LightningModule& model, std::shared_ptr<BatchSource> train_loader,
                       LRFinderOptions options = LRFinderOptions());
LRFinderResult lr_find(const Trainer& trainer, LightningModule& model, DataModule& datamodule,
                       LRFinderOptions options = LRFinderOptions());

// LearningRateFinder: the range test at the start of fit, on the fit's own strategy, data and
// module (Lightning's callbacks.LearningRateFinder, which runs it at on_fit_start). Its
// num_training_steps optimizer steps (over as many epochs of the training loader as they need,
// whatever the fit's max_epochs) run with the test as the only callback and no loggers,
// validation or checkpoints; then the module's weights (bit for bit), the generators and the loop
// are put back, configure_optimizers makes the optimizers anew, and with update_attr the
// suggestion becomes the rate the fit trains with:
//  - with a setter, the setter gives it to the module (its own field, as `model.lr = ...` above)
//    and configure_optimizers runs again, so the optimizers and their schedulers are made with it;
//  - without one, every parameter group of the optimizers takes it, as Lightning also sets them;
//    a scheduler made in configure_optimizers keeps the base rate it was made with, so a module
//    that schedules its rate should give a setter.
// Under a strategy of several processes (ddp, xla) every rank runs the same steps in lockstep, as
// in fit, and the loss of each step is the mean over the ranks (one all-reduce of a number), so
// every rank draws the same curve, stops at the same step and reaches the same suggestion, with no
// broadcast after it. (Lightning records each rank's own loss, broadcasts rank 0's stop decision
// at each step and rank 0's curve at the end; the mean follows the loss of the global batch that
// the optimizer descends.) Rank 0 writes the curve's CSV. A fit resumed from a checkpoint past
// step 0 is not tested again: its optimizers' state already holds the rate it trained with, and
// the setter gets the rate kept in the checkpoint. Its schedulers, though, were made by
// configure_optimizers before the restore, from the module's field as it was then: a module that
// schedules its rate should keep the found rate itself (in its hparams, say) to resume the same
// schedule. Not run under fast_dev_run (a warning), as in Lightning.
//
// Example:
//   auto finder = std::make_shared<fulgur::LearningRateFinder>(
//       fulgur::LearningRateFinderOptions().num_training_steps(50),
//       [](fulgur::LightningModule& m, double lr) { static_cast<Net&>(m).lr = lr; });
//   fulgur::Trainer trainer(fulgur::TrainerOptions().max_epochs(10).callbacks({finder}));
//   trainer.fit(model, datamodule);   // finder->optimal_lr(): the rate it trained with
struct LearningRateFinderOptions {
  // As LRFinderOptions: the rates tried, how they grow, the early stop.
  TORCH_ARG(double, min_lr) = 1e-8;
  TORCH_ARG(double, max_lr) = 1.0;
  TORCH_ARG(int64_t, num_training_steps) = 100;
  TORCH_ARG(std::string, mode) = "exponential";
  TORCH_ARG(std::optional<double>, early_stop_threshold) = 4.0;
  // Train with the suggestion (above); false: only record it (optimal_lr()).
  TORCH_ARG(bool, update_attr) = true;
  // Where rank 0 writes the curve; "": <default_root_dir>/lr_find.csv.
  TORCH_ARG(std::string, csv_path) = "";
};

// Gives the module the rate found (every rank calls it, with the same value).
using LearningRateSetter = std::function<void(LightningModule&, double)>;

class LearningRateFinder : public Callback {
 public:
  // Bad options throw std::invalid_argument naming the value and what is allowed.
  explicit LearningRateFinder(LearningRateFinderOptions options = LearningRateFinderOptions(),
                              LearningRateSetter set_lr = nullptr);
  std::string state_key() const override { return "LearningRateFinder"; }
  void on_fit_start(Trainer& trainer, LightningModule& model) override;

  // The curve of the last test on this rank (empty before one ran).
  const LRFinderResult& result() const { return result_; }
  // Its suggestion (Lightning's optimal_lr), unset before a test or without one. In the
  // launching process of a multi-process fit, rank 0's, which comes back with the callback
  // states; the setter ran in the workers, on their modules.
  std::optional<double> optimal_lr() const { return optimal_lr_; }

  // The suggestion is kept in checkpoints, so that a resumed fit still reports it.
  c10::IValue state_dict() const override;
  void load_state_dict(const c10::IValue& state) override;

 private:
  LRFinderOptions test_options() const;

  LearningRateFinderOptions options_;
  LearningRateSetter set_lr_;
  LRFinderResult result_;
  std::optional<double> optimal_lr_;
};

}  // namespace fulgur
