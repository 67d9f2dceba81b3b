// SPDX-License-Identifier: Apache-2.0
#pragma once
// ModelCheckpoint: saves checkpoints during fit, keeps the best k and "last".
//
// Example:
//   auto ckpt = std::make_shared<fulgur::ModelCheckpoint>(
//       fulgur::ModelCheckpointOptions().monitor("val_loss").save_top_k(2).save_last(true));

#include <fulgur/callbacks/callback.h>

#include <torch/arg.h>

#include <map>
#include <optional>
#include <string>

namespace fulgur {

struct ModelCheckpointOptions {
  // Folder; default: <log_dir>/checkpoints, or <default_root_dir>/checkpoints without a logger.
  TORCH_ARG(std::string, dirpath) = "";
  // Name template: {epoch}, {step} and any logged metric, e.g. "{epoch:02d}-{val_loss:.3f}".
  // Each field becomes "name=value" (Lightning's auto_insert_metric_name). Formats, as Python
  // writes them: epoch and step "[0][width]d", a metric "[0][width][.precision]" and one of
  // e E f F g G (default .4f); any other is refused by the constructor (std::invalid_argument).
  TORCH_ARG(std::string, filename) = "{epoch}-{step}";
  // Metric to rank checkpoints by; empty keeps the most recent ones.
  TORCH_ARG(std::string, monitor) = "";
  // "min" or "max".
  TORCH_ARG(std::string, mode) = "min";
  // How many to keep: -1 all, 0 none (only "last" if save_last).
  TORCH_ARG(int64_t, save_top_k) = 1;
  // Also write last.ckpt at every save.
  TORCH_ARG(bool, save_last) = false;
  // Save after every n-th epoch (at validation end, or train epoch end without validation).
  TORCH_ARG(int64_t, every_n_epochs) = 1;
  // Save every n optimizer steps instead (0 = off).
  TORCH_ARG(int64_t, every_n_train_steps) = 0;
};

class ModelCheckpoint : public Callback {
 public:
  // Throws std::invalid_argument for a bad mode, save_top_k < -1, every_n_* < 0.
  explicit ModelCheckpoint(ModelCheckpointOptions options = {});

  std::string state_key() const override;
  void on_fit_start(Trainer&, LightningModule&) override;
  void on_train_batch_end(Trainer&, LightningModule&, const StepOutput&, const Batch&, int64_t) override;
  void on_train_epoch_end(Trainer&, LightningModule&) override;
  void on_validation_end(Trainer&, LightningModule&) override;
  c10::IValue state_dict() const override;
  // Restores the kept paths and scores. Paths that do not lie inside this
  // callback's folder (resolved, so neither ".." nor a symlink leads out) are
  // dropped with a warning at the next fit start, and never removed. At that
  // start, files in the folder that match this callback's name pattern but
  // are not kept (left by a run killed between a save and its record) are
  // removed, unless save_top_k is -1.
  void load_state_dict(const c10::IValue& state) override;

  // Saves now (all ranks must call; rank 0 writes).
  void save(Trainer& trainer);

  const std::string& dirpath() const { return dirpath_; }
  const std::string& best_model_path() const { return best_model_path_; }
  std::optional<double> best_model_score() const { return best_model_score_; }
  const std::string& last_model_path() const { return last_model_path_; }
  // Paths of the kept top-k checkpoints and their scores.
  const std::map<std::string, double>& best_k_models() const { return best_k_models_; }
  // The file name (no folder, no extension) the template gives for these values.
  std::string format_name(int64_t epoch, int64_t step, const std::map<std::string, double>& metrics) const;
  const ModelCheckpointOptions& options() const { return options_; }

 private:
  bool better(double a, double b) const;
  void save_top_k(Trainer& trainer, const std::string& path, std::optional<double> score);
  // Forgets kept, best and last paths outside dirpath_; warns if `warn`.
  void drop_foreign_paths(bool warn);
  // True when `relative` (a path under dirpath_) is a name this callback's
  // filename template gives.
  bool has_own_name(const std::string& relative) const;
  // Removes the files of this callback's name pattern in dirpath_ that are not kept.
  void remove_orphans(Trainer& trainer);

  ModelCheckpointOptions options_;
  std::string dirpath_;
  std::string best_model_path_;
  std::optional<double> best_model_score_;
  std::string last_model_path_;
  std::map<std::string, double> best_k_models_;
  int64_t last_saved_step_ = -1;
  bool saw_validation_ = false;
  bool restored_ = false;  // load_state_dict ran since the last fit start
};

}  // namespace fulgur
