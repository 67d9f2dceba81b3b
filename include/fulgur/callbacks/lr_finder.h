// SPDX-License-Identifier: Apache-2.0
#pragma once
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

#include <fulgur/trainer.h>

#include <torch/arg.h>

#include <cstdint>
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

}  // namespace fulgur
