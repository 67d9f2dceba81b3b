// SPDX-License-Identifier: Apache-2.0
#pragma once
// TensorBoardLogger in Lightning's layout: TensorBoard event files in
//   <root_dir>/<name>/version_<N>/events.out.tfevents.<time>.<host>.<pid>.<n>
// which `tensorboard --logdir <root_dir>` shows (scalars, and the model's
// hparams in the HParams tab), and hparams.yaml beside them. Needs no
// TensorBoard or protobuf library.
//
// Example (with a CSVLogger beside it):
//   fulgur::Trainer trainer(fulgur::TrainerOptions().logger(
//       {std::make_shared<fulgur::TensorBoardLogger>("runs"), std::make_shared<fulgur::CSVLogger>("runs")}));

#include <fulgur/loggers/logger.h>

#include <torch/arg.h>

#include <memory>
#include <optional>

namespace fulgur {
namespace detail {
class EventFile;
}

struct TensorBoardLoggerOptions {
  explicit TensorBoardLoggerOptions(std::string root_dir) : root_dir_(std::move(root_dir)) {}
  TORCH_ARG(std::string, root_dir);
  TORCH_ARG(std::string, name) = "lightning_logs";
  // A fixed N, or unset: the next free one in <root_dir>/<name>.
  TORCH_ARG(std::optional<int64_t>, version) = std::nullopt;
  // Put before every metric's tag with a "-" ("train" makes "train-loss"), as
  // Lightning's prefix.
  TORCH_ARG(std::string, prefix) = "";
  // log_hyperparams also logs the scalar hp_metric = -1 at step 0 and names it
  // the hparams' metric, as Lightning does, so that the HParams tab lists the
  // run (log "hp_metric" yourself to give it a real value).
  TORCH_ARG(bool, default_hp_metric) = true;
};

// Only global rank 0 calls it (the Trainer sees to that): the event file is
// created at the first write, in the process that writes. Not thread safe.
class TensorBoardLogger : public Logger {
 public:
  explicit TensorBoardLogger(TensorBoardLoggerOptions options);
  explicit TensorBoardLogger(std::string root_dir, std::string name = "lightning_logs",
                             std::optional<int64_t> version = std::nullopt);
  ~TensorBoardLogger() override;
  std::string name() const override { return options_.name(); }
  std::string version() override;
  std::string log_dir() override;
  // One event at `step` with a float32 scalar (Summary simple_value) per
  // metric, on disk when this returns. Throws std::runtime_error naming the
  // file if it cannot be written.
  void log_metrics(const std::map<std::string, double>& metrics, int64_t step) override;
  // The HParams plugin's three summaries, as torch.utils.tensorboard's
  // hparams() writes them: the experiment (each hparam's name and type, the
  // metric hp_metric with default_hp_metric), the session start with the
  // values, the session end. Nested dicts are flattened with "/" ("optim/lr");
  // numbers become float64, strings and bools stay, None is left out, any other
  // value is written as its text. Also writes <log_dir>/hparams.yaml, as
  // CSVLogger does (the dict unflattened), as Lightning's logger does.
  void log_hyperparams(const c10::Dict<std::string, c10::IValue>& hparams) override;
  // Nothing to do: every write is flushed.
  void save() override;
  // Closes the event file; a later write opens a new one in the same folder
  // (TensorBoard reads them all, in name order).
  void finalize(const std::string& status) override;
  const TensorBoardLoggerOptions& options() const { return options_; }
  // Fixes the version (the trainer uses it to adopt rank 0's choice).
  void set_version(int64_t version) { options_.version(version); }

 private:
  detail::EventFile& file();
  TensorBoardLoggerOptions options_;
  std::unique_ptr<detail::EventFile> file_;
};

}  // namespace fulgur
