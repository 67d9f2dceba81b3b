// SPDX-License-Identifier: Apache-2.0
// The fit loop: its start (hooks, the sanity check), its epochs, a stop on a signal and its end.

#include "trainer/loops/fit_loop.h"

#include <fulgur/callbacks/early_stopping.h>
#include <fulgur/callbacks/model_checkpoint.h>
#include <fulgur/callbacks/timer.h>
#include <fulgur/data/data_loader.h>
#include <fulgur/launchers/launcher.h>
#include <fulgur/lightning_module.h>
#include <fulgur/strategies/strategy.h>
#include <fulgur/trainer.h>

#include "launchers/restarts.h"
#include "runtime/log.h"
#include "runtime/signals.h"
#include "trainer/trainer_impl.h"

#include <csignal>
#include <stdexcept>

namespace fulgur::detail {

bool FitLoop::stop_agreed(bool last) { return t_.evaluation_loop.stopped() || poll_stop_signal(poll_, last); }

void FitLoop::setup_schedule() {
  const TrainerOptions& options = t_.options;
  TrainingEpochLoop::Schedule s;
  s.batches = t_.resolved.batches(options.limit_train_batches(), train_source->num_batches(), "limit_train_batches");
  s.val_batches =
      val_source ? t_.resolved.batches(options.limit_val_batches(), val_source->num_batches(), "limit_val_batches") : 0;
  const BatchLimit& vci = options.val_check_interval();
  s.val_at_end = vci.is_fraction();
  if (vci.is_fraction()) {
    s.val_every = std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(s.batches) * vci.value()));
  } else {
    s.val_every = static_cast<int64_t>(vci.value());
  }
  epoch_loop.set_schedule(s);
  if (!vci.is_fraction() && s.val_every > s.batches && val_source) {
    throw std::invalid_argument("val_check_interval=" + std::to_string(s.val_every) + " is more than the " +
                                std::to_string(s.batches) + " training batches of an epoch");
  }
}

void FitLoop::run() {
  setup_schedule();
  on_run_start();
  while (!done()) {
    if (num_training_batches() == 0) break;
    if (!advance()) break;
  }
  on_run_end();
}

void FitLoop::on_run_start() {
  LightningModule& model = *t_.model;
  // Over a copy: LearningRateFinder's on_fit_start runs steps with its test as the only
  // callback (run_probe), which swaps this list while the loop walks it.
  for (auto& c : std::vector<std::shared_ptr<Callback>>(t_.callbacks)) c->on_fit_start(t_.owner, model);
  model.on_fit_start();
  // Where this fit's last.ckpt goes (resolved by on_fit_start), for a restart
  // of the launch to resume from.
  if (auto* mc = t_.owner.checkpoint_callback(); mc && t_.strategy->is_global_zero())
    record_checkpoint_folder(mc->dirpath());
  sanity_check();
  for (auto& c : t_.callbacks) c->on_train_start(t_.owner, model);
}

void FitLoop::sanity_check() {
  const int64_t val_batches = num_val_batches();
  if (!val_source || val_batches == 0 || t_.progress.global_step != 0 || t_.resolved.limit_overrides != 0) return;
  const int64_t steps = t_.options.num_sanity_val_steps();
  const int64_t n = steps == -1 ? val_batches : std::min(steps, val_batches);
  if (n > 0) t_.evaluation_loop.run(Stage::kSanityCheck, *val_source, n);
}

bool FitLoop::done() const {
  const Progress& progress = t_.progress;
  if (t_.options.max_steps() != -1 && progress.global_step >= t_.options.max_steps()) return true;
  if (t_.resolved.max_epochs != -1 && progress.epoch >= t_.resolved.max_epochs) return true;
  return should_stop_ && progress.epoch >= t_.options.min_epochs();
}

bool FitLoop::advance() {
  LightningModule& model = *t_.model;
  Progress& progress = t_.progress;
  train_source->set_epoch(progress.epoch);
  if (val_source) val_source->set_epoch(progress.epoch);
  model.train();
  t_.logging.results.reset();
  // A run resumed from a checkpoint written after the epoch's last batch
  // (by its end hook) has no batch left: it goes on to the epoch's end.
  progress.epoch_finished = progress.batches_done >= num_training_batches();
  progress.epoch_schedulers_stepped = false;
  for (auto& c : t_.callbacks) c->on_train_epoch_start(t_.owner, model);
  model.on_train_epoch_start();
  // An evaluation stopped by a signal (the sanity check) ends the fit before any batch.
  if (t_.evaluation_loop.stopped() || epoch_loop.run(*train_source, val_source.get())) on_interrupt();
  // Epoch end: aggregates, hooks, then the next epoch.
  auto values = t_.logging.results.epoch_values(t_.logging.reducer());
  t_.logging.log_epoch_metrics(values, to_doubles(values), progress.global_step);
  model.on_train_epoch_end();
  for (auto& c : t_.callbacks) c->on_train_epoch_end(t_.owner, model);
  t_.logging.log_step_metrics(true);
  epoch_loop.step_schedulers("epoch");
  progress.epoch_schedulers_stepped = true;
  if (!progress.epoch_finished) return false;  // stopped mid-epoch (max_steps or should_stop)
  ++progress.epoch;
  progress.batches_done = 0;
  return true;
}

void FitLoop::on_interrupt() {
  const int sig = runtime::received_stop_signal() ? runtime::received_stop_signal() : SIGTERM;
  const int64_t step = t_.progress.global_step;
  // last.ckpt only where checkpointing is on (a ModelCheckpoint, the default one or the
  // user's); with enable_checkpointing(false) or fast_dev_run nothing is written.
  std::string saved = "no checkpoint written (checkpointing is off)", report = saved;
  if (auto* mc = t_.owner.checkpoint_callback()) {
    const std::string path = (mc->dirpath().empty() ? t_.owner.log_dir() + "/checkpoints" : mc->dirpath()) + "/last.ckpt";
    t_.owner.save_checkpoint(path);
    saved = "checkpoint saved to " + path;
    report = "last checkpoint " + path;
  }
  const std::string signal = "signal " + std::to_string(sig);
  runtime::log_rank_zero(runtime::LogLevel::kWarning, "stopping at step " + std::to_string(step) + " on " + signal + "; " + saved);
  if (t_.strategy->is_global_zero())
    for (auto& l : t_.loggers) l->finalize("interrupted");
  t_.logging.report_fit_end(signal + " (" + runtime::signal_name(sig) + "); " + report);
  throw WorkerFailure("interrupted by " + signal + " at step " + std::to_string(step) + "; " + saved,
                      static_cast<int>(t_.strategy->global_rank()), 128 + sig);
}

void FitLoop::on_run_end() {
  LightningModule& model = *t_.model;
  for (auto& c : t_.callbacks) c->on_train_end(t_.owner, model);
  model.on_fit_end();
  for (auto& c : t_.callbacks) c->on_fit_end(t_.owner, model);
  t_.strategy->on_train_end();
  if (t_.strategy->is_global_zero()) {
    for (auto& l : t_.loggers) {
      l->save();
      l->finalize("success");
    }
  }
  t_.logging.report_fit_end(stop_reason());
}

std::string FitLoop::stop_reason() const {
  const Progress& progress = t_.progress;
  if (num_training_batches() == 0) return "no training batches (limit_train_batches gives 0)";
  if (t_.options.max_steps() != -1 && progress.global_step >= t_.options.max_steps()) {
    return "max_steps=" + std::to_string(t_.options.max_steps()) + " reached";
  }
  if (should_stop_) {
    if (auto* es = find_callback<EarlyStopping>(t_.callbacks);
        es && es->stopped_epoch() == progress.epoch - (progress.epoch_finished ? 1 : 0)) {
      const std::string& monitor = es->options().monitor();
      std::string why = "EarlyStopping on " + monitor;
      if (auto it = t_.logging.callback_metrics.find(monitor); it != t_.logging.callback_metrics.end()) why += "=" + format_metric(it->second);
      return why + (es->reason().empty() ? " (the decision of another rank)" : " (" + es->reason() + ")");
    }
    if (auto* timer = find_callback<Timer>(t_.callbacks); timer && !timer->reason().empty()) return timer->reason();
    return "should_stop was set";
  }
  if (t_.resolved.max_epochs != -1 && progress.epoch >= t_.resolved.max_epochs) {
    return "max_epochs=" + std::to_string(t_.resolved.max_epochs) + " reached";
  }
  return "the training loader ran out";
}

}  // namespace fulgur::detail
