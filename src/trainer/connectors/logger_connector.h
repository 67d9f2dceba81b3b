// SPDX-License-Identifier: Apache-2.0
#pragma once
// What the module logs and where it goes (Lightning's trainer/connectors/logger_connector/):
// LightningModule::log into the stage's ResultCollection, step and epoch rows to
// callback_metrics, the progress bar and the loggers (rank 0), and rank 0's report at the end of
// fit. Values stay tensors until something reads them (callback_metrics, a logger's row).

#include <fulgur/trainer.h>  // Metrics
#include <fulgur/types.h>

#include "trainer/results.h"

#include <cstdint>
#include <map>
#include <string>

namespace fulgur::detail {

struct TrainerImpl;

class LoggerConnector {
 public:
  explicit LoggerConnector(TrainerImpl& trainer) : t_(trainer) {}

  // LightningModule::log. Throws std::logic_error outside a run, and
  // std::invalid_argument for rank_zero_only with sync_dist.
  void log(const std::string& name, const at::Tensor& value, const LogOptions& options);
  // The step values logged since the last call: to the progress bar and callback_metrics, and
  // (rank 0, every log_every_n_steps or when `force`) a row to the loggers.
  void log_step_metrics(bool force);
  // Records epoch aggregates (already read to doubles in `read`) in
  // callback_metrics, the progress bar and the logger.
  void log_epoch_metrics(const std::map<std::string, ResultCollection::Logged>& values, const Metrics& read,
                         int64_t step);
  // Reduces a logged value across ranks (for sync_dist).
  ResultCollection::Reducer reducer();
  // Reads the pending step values into callback_metrics (one host sync each).
  void materialize_metrics() const;
  // Rank 0 prints, at info: why fit stopped, the best checkpoint and its
  // score, and the log folder.
  void report_fit_end(const std::string& why) const;

  // The running stage's logged values (an evaluation inside fit swaps in its own).
  ResultCollection results;
  mutable Metrics callback_metrics;
  mutable std::map<std::string, at::Tensor> pending_callback_metrics;
  mutable Metrics progress_bar_metrics;
  std::map<std::string, at::Tensor> pending_prog_bar;
  // The step of the last row sent to the loggers (one row per step).
  int64_t last_logged_step = -1;
  // The batch size LightningModule::log weighs epoch means with: the running batch's.
  int64_t current_batch_size = 1;

 private:
  TrainerImpl& t_;
};

}  // namespace fulgur::detail
