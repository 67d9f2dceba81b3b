// SPDX-License-Identifier: Apache-2.0
#pragma once
// CSVLogger in Lightning's layout:
//   <root_dir>/<name>/version_<N>/metrics.csv
//   <root_dir>/<name>/version_<N>/hparams.yaml
//
// Example:
//   auto logger = std::make_shared<fulgur::CSVLogger>(
//       fulgur::CSVLoggerOptions("runs").flush_logs_every_n_steps(10));
//   fulgur::Trainer trainer(fulgur::TrainerOptions().logger(logger));

#include <fulgur/loggers/logger.h>

#include <torch/arg.h>

#include <optional>
#include <vector>

namespace fulgur {

struct CSVLoggerOptions {
  explicit CSVLoggerOptions(std::string root_dir) : root_dir_(std::move(root_dir)) {}
  TORCH_ARG(std::string, root_dir);
  TORCH_ARG(std::string, name) = "lightning_logs";
  // A fixed N, or unset: the next free one in <root_dir>/<name>.
  TORCH_ARG(std::optional<int64_t>, version) = std::nullopt;
  // Put before every metric name with a "-" ("train" makes "train-loss"), as
  // Lightning's prefix; the step column keeps its name.
  TORCH_ARG(std::string, prefix) = "";
  // Kept rows are written to metrics.csv when a row's step is n or more past
  // the last write (and at save()): a killed run loses at most the rows of its
  // last n steps. Smaller n: more writes. Must be >= 1.
  TORCH_ARG(int64_t, flush_logs_every_n_steps) = 100;
};

// Only global rank 0 calls it (the Trainer sees to that). Not thread safe.
class CSVLogger : public Logger {
 public:
  // Throws std::invalid_argument for flush_logs_every_n_steps < 1.
  explicit CSVLogger(CSVLoggerOptions options);
  explicit CSVLogger(std::string root_dir, std::string name = "lightning_logs",
                     std::optional<int64_t> version = std::nullopt);
  std::string name() const override { return options_.name(); }
  std::string version() override;
  std::string log_dir() override;
  // Keeps the row; writes the kept rows when `step` is flush_logs_every_n_steps
  // or more past the last write.
  void log_metrics(const std::map<std::string, double>& metrics, int64_t step) override;
  // Writes <log_dir>/hparams.yaml (replacing it): the hparams as a YAML
  // mapping, nested dicts nested, that yaml.safe_load reads back.
  void log_hyperparams(const c10::Dict<std::string, c10::IValue>& hparams) override;
  // Appends the kept rows to metrics.csv (creating it with a header: columns
  // sorted, "step" last). An existing file, from this logger or an earlier
  // stage's process, is appended to, and rewritten only when a row brings a
  // column it lacks: the header widens and earlier rows get empty cells.
  void save() override;
  void finalize(const std::string& status) override;
  const std::string& root_dir() const { return options_.root_dir(); }
  const CSVLoggerOptions& options() const { return options_; }
  // Fixes the version (the trainer uses it to adopt rank 0's choice).
  void set_version(int64_t version) { options_.version(version); }

 private:
  CSVLoggerOptions options_;
  std::vector<std::map<std::string, double>> rows_;  // not yet written
  int64_t written_step_ = 0;  // step of the last write
};

}  // namespace fulgur
