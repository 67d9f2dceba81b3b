// SPDX-License-Identifier: Apache-2.0
// The logger connector: LightningModule::log into the ResultCollection, step
// and epoch rows to callback_metrics, the progress bar and the loggers, and
// rank 0's report at the end of fit.

#include "trainer/connectors/logger_connector.h"

#include <fulgur/callbacks/model_checkpoint.h>
#include <fulgur/lightning_module.h>
#include <fulgur/strategies/strategy.h>
#include <fulgur/trainer.h>

#include "runtime/log.h"
#include "trainer/trainer_impl.h"

#include <set>
#include <stdexcept>

namespace fulgur::detail {

void LoggerConnector::materialize_metrics() const {
  for (const auto& [k, v] : pending_callback_metrics) callback_metrics[k] = v.item<double>();
  pending_callback_metrics.clear();
}

void LoggerConnector::log(const std::string& name, const at::Tensor& value, const LogOptions& opts) {
  if (!t_.model) throw std::logic_error("log('" + name + "') was called outside a Trainer run");
  if (opts.rank_zero_only() && opts.sync_dist()) {
    throw std::invalid_argument("log('" + name + "'): rank_zero_only=true with sync_dist=true: the reduction is a "
                                "collective that the other ranks would never join; drop one of the two");
  }
  if (opts.rank_zero_only() && !t_.strategy->is_global_zero()) return;
  results.log(name, value, opts, t_.fit_loop.epoch_loop.in_training_step(), current_batch_size, reducer());
}
ResultCollection::Reducer LoggerConnector::reducer() {
  return [this](const at::Tensor& t, const std::string& op) { return t_.strategy->reduce(t, op); };
}

void LoggerConnector::log_step_metrics(bool force) {
  std::map<std::string, ResultCollection::Logged> for_logger;
  for (auto& [k, v] : results.take_step_values()) {
    if (v.prog_bar) pending_prog_bar[k] = v.value;
    if (!v.logger) continue;
    pending_callback_metrics[k] = v.value;
    for_logger.emplace(k, v);
  }
  const bool due = t_.progress.global_step % t_.options.log_every_n_steps() == 0 || force;
  if (t_.loggers.empty() || !t_.strategy->is_global_zero() || for_logger.empty() || !due || t_.progress.global_step == last_logged_step) {
    return;
  }
  last_logged_step = t_.progress.global_step;
  auto row = to_doubles(for_logger);
  row["epoch"] = static_cast<double>(t_.progress.epoch);
  for (auto& l : t_.loggers) l->log_metrics(row, t_.progress.global_step);
}

void LoggerConnector::log_epoch_metrics(const std::map<std::string, ResultCollection::Logged>& values,
                                    const Metrics& read, int64_t step) {
  std::map<std::string, double> row;
  for (const auto& [k, ev] : values) {
    const double v = read.at(k);
    callback_metrics[k] = v;
    if (ev.prog_bar) progress_bar_metrics[k] = v;
    if (ev.logger) row[k] = v;
  }
  if (t_.strategy->is_global_zero() && !row.empty()) {
    row["epoch"] = static_cast<double>(t_.progress.epoch);
    for (auto& l : t_.loggers) l->log_metrics(row, step);
  }
}

void LoggerConnector::report_fit_end(const std::string& why) const {
  if (!t_.strategy->is_global_zero()) return;
  using runtime::LogLevel;
  runtime::log_rank_zero(LogLevel::kInfo, "fit stopped at epoch " + std::to_string(t_.progress.epoch) + ", step " +
                                              std::to_string(t_.progress.global_step) + ": " + why);
  if (auto* mc = t_.owner.checkpoint_callback()) {
    if (!mc->best_model_path().empty()) {
      const std::string& monitor = mc->options().monitor();
      std::string score = monitor.empty() || !mc->best_model_score()
                              ? "the most recent; no monitor"
                              : monitor + "=" + format_metric(*mc->best_model_score());
      runtime::log_rank_zero(LogLevel::kInfo, "best checkpoint: " + mc->best_model_path() + " (" + score + ")");
    } else if (!mc->last_model_path().empty()) {
      runtime::log_rank_zero(LogLevel::kInfo, "last checkpoint: " + mc->last_model_path());
    } else {
      runtime::log_rank_zero(LogLevel::kInfo, "no checkpoint was saved");
    }
  } else {
    runtime::log_rank_zero(LogLevel::kInfo, "no checkpoints (enable_checkpointing is off)");
  }
  // Several loggers share one version folder (CSV and TensorBoard): each folder once.
  std::string dirs;
  std::set<std::string> seen;
  for (const auto& l : t_.loggers)
    if (seen.insert(l->log_dir()).second) dirs += (dirs.empty() ? "" : ", ") + l->log_dir();
  runtime::log_rank_zero(LogLevel::kInfo, t_.loggers.empty() ? "no logs (logger is off)" : "logs: " + dirs);
}

}  // namespace fulgur::detail

