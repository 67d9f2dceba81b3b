// SPDX-License-Identifier: Apache-2.0
// The training-epoch loop: batches, validation inside the epoch, the schedulers.

#include "trainer/loops/training_epoch_loop.h"

#include <fulgur/callbacks/callback.h>
#include <fulgur/data/data_loader.h>
#include <fulgur/lightning_module.h>
#include <fulgur/lr_scheduler.h>
#include <fulgur/strategies/strategy.h>

#include "runtime/log.h"
#include "trainer/trainer_impl.h"

#include <stdexcept>

namespace fulgur::detail {

bool TrainingEpochLoop::should_check_val(int64_t batch_idx, bool last) const {
  return schedule_.val_batches > 0 && (t_.progress.epoch + 1) % t_.options.check_val_every_n_epoch() == 0 &&
         ((batch_idx + 1) % schedule_.val_every == 0 || (last && schedule_.val_at_end));
}

bool TrainingEpochLoop::run(BatchSource& train, BatchSource* val) {
  Progress& progress = t_.progress;
  const int64_t max_steps = t_.options.max_steps();
  auto stream = train.open(progress.batches_done);
  for (int64_t batch_idx = progress.batches_done; batch_idx < schedule_.batches; ++batch_idx) {
    auto batch = stream->next();
    if (!batch) break;
    const bool last = batch_idx + 1 == schedule_.batches;
    run_batch(*batch, batch_idx, last);
    const bool check_val = val && should_check_val(batch_idx, last);
    if (last) progress.epoch_finished = true;
    if (check_val) t_.evaluation_loop.run(Stage::kValidate, *val, schedule_.val_batches);
    if (t_.fit_loop.stop_agreed(last)) return true;
    if (max_steps != -1 && progress.global_step >= max_steps) break;
    if (t_.fit_loop.should_stop() && progress.epoch >= t_.options.min_epochs()) break;
  }
  return false;
}

void TrainingEpochLoop::run_batch(const Batch& batch, int64_t batch_idx, bool last) {
  LightningModule& model = *t_.model;
  t_.logging.current_batch_size = batch_size_of(batch);
  t_.strategy->on_train_batch_start(batch, batch_idx);
  model.on_train_batch_start(batch, batch_idx);
  StepOutput out;
  if (model.automatic_optimization()) {
    AutomaticOptimization::Result result = automatic.run(batch, batch_idx, last);
    out = std::move(result.output);
    if (result.stepped) step_schedulers("step");
  } else {
    out = manual.run(batch, batch_idx);
  }
  t_.logging.log_step_metrics(false);
  // The batch is done before its end hooks run: a checkpoint that a hook
  // writes (ModelCheckpoint's every_n_train_steps) resumes after it, not
  // with it again.
  t_.progress.batches_done = batch_idx + 1;
  model.on_train_batch_end(out, batch, batch_idx);
  for (auto& c : t_.callbacks) c->on_train_batch_end(t_.owner, model, out, batch, batch_idx);
}

void TrainingEpochLoop::step_schedulers(const std::string& interval) {
  if (schedulers_paused_) return;
  const auto& cfg = t_.strategy->optimizer_config();
  for (size_t i = 0; i < cfg.schedulers.size(); ++i) {
    const auto& s = cfg.schedulers[i];
    if (s.interval() != interval) continue;
    const int64_t unit = interval == "step" ? t_.progress.global_step : t_.progress.epoch + 1;
    if (unit % std::max<int64_t>(1, s.frequency()) != 0) continue;
    if (auto* plateau = dynamic_cast<lr_scheduler::ReduceLROnPlateau*>(s.scheduler().get())) {
      // Lightning's rule: the monitored metric's current value; a missing one is an error, or a
      // skipped step with a warning when not strict.
      t_.logging.materialize_metrics();
      const auto it = t_.logging.callback_metrics.find(s.monitor());
      if (it == t_.logging.callback_metrics.end()) {
        std::string logged;
        for (const auto& [k, v] : t_.logging.callback_metrics) logged += (logged.empty() ? "" : ", ") + k;
        const std::string what = "ReduceLROnPlateau (scheduler " + std::to_string(i) + ") follows '" + s.monitor() +
                                 "', which is not logged at this " + interval + "; logged: [" + logged + "]";
        if (s.strict()) throw std::runtime_error(what + ". Log it, name another in SchedulerConfig::monitor, or set strict(false)");
        runtime::warn_rank_zero_once(what + "; strict is false, so the step is skipped");
        continue;
      }
      plateau->step(it->second);
    } else {
      s.scheduler()->step();
    }
    ++t_.progress.scheduler_counts[i];
  }
}

}  // namespace fulgur::detail
