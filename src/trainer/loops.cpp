// SPDX-License-Identifier: Apache-2.0
// The loops: fit (with the sanity check, validation inside the epoch and the
// stop on a signal), evaluation, predict, and the automatic optimization
// step with gradient accumulation, clipping and the schedulers.

#include <fulgur/callbacks/early_stopping.h>
#include <fulgur/callbacks/model_checkpoint.h>
#include <fulgur/callbacks/timer.h>
#include <fulgur/data/device_loader.h>
#include <fulgur/launchers/launcher.h>
#include <fulgur/lr_scheduler.h>
#include <fulgur/strategies/strategy.h>
#include <fulgur/trainer.h>

#include "launchers/restarts.h"
#include "runtime/log.h"
#include "runtime/signals.h"
#include "trainer/trainer_impl.h"

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/torch.h>

#include <csignal>
#include <stdexcept>

namespace fulgur::detail {
namespace {

std::string signal_name(int sig) {
  if (sig == SIGTERM) return "SIGTERM";
  if (sig == SIGINT) return "SIGINT";
  return "signal " + std::to_string(sig);
}

int64_t batch_size_of(const Batch& batch) {
  return batch.data.defined() && batch.data.dim() > 0 ? batch.data.size(0) : 1;
}

}  // namespace

void TrainerImpl::manual_optimizer_step(torch::optim::Optimizer& optimizer, const std::function<void()>& closure) {
  strategy->optimizer_step(optimizer, closure, nullptr);
  ++progress.global_step;
}

void TrainerImpl::clip_gradients(torch::optim::Optimizer& optimizer) {
  if (!resolved.gradient_clip_val) return;
  const double clip = *resolved.gradient_clip_val;
  torch::NoGradGuard no_grad;
  std::vector<at::Tensor> grads;
  for (auto& g : optimizer.param_groups())
    for (auto& p : g.params())
      if (p.grad().defined()) grads.push_back(p.mutable_grad());
  if (grads.empty()) return;
  if (options.gradient_clip_algorithm() == "value") {
    for (auto& g : grads) g.clamp_(-clip, clip);
    return;
  }
  // Norm clipping without reading the norm on the host (no sync on xla devices).
  std::vector<at::Tensor> norms;
  for (auto& g : grads) norms.push_back(g.norm(2).to(torch::kFloat32));
  auto total = torch::stack(norms).norm(2);
  // clamp(max=1), as PyTorch's clip_grad_norm_ writes it: libtorch's lazy core has a node for
  // aten::clamp and none for aten::clamp_max, which would run on the host and split the step.
  auto coef = (clip / (total + 1e-6)).clamp(std::nullopt, 1.0);
  for (auto& g : grads) g.mul_(coef.to(g.scalar_type()));
}

void TrainerImpl::step_schedulers(const std::string& interval) {
  if (schedulers_paused) return;
  const auto& cfg = strategy->optimizer_config();
  for (size_t i = 0; i < cfg.schedulers.size(); ++i) {
    const auto& s = cfg.schedulers[i];
    if (s.interval() != interval) continue;
    const int64_t unit = interval == "step" ? progress.global_step : progress.epoch + 1;
    if (unit % std::max<int64_t>(1, s.frequency()) != 0) continue;
    if (auto* plateau = dynamic_cast<lr_scheduler::ReduceLROnPlateau*>(s.scheduler().get())) {
      // Lightning's rule: the monitored metric's current value; a missing one is an error, or a
      // skipped step with a warning when not strict.
      materialize_metrics();
      const auto it = callback_metrics.find(s.monitor());
      if (it == callback_metrics.end()) {
        std::string logged;
        for (const auto& [k, v] : callback_metrics) logged += (logged.empty() ? "" : ", ") + k;
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
    ++progress.scheduler_counts[i];
  }
}

void TrainerImpl::optimizer_step_automatic(const Batch& batch, int64_t batch_idx, StepOutput& out, bool sync_now) {
  const auto& cfg = strategy->optimizer_config();
  auto& optimizer = *cfg.optimizers.at(0);
  const double k = static_cast<double>(accumulate_grad_batches);
  auto closure = [&] {
    in_training_step = true;
    out = strategy->training_step(batch, batch_idx);
    in_training_step = false;
    if (!out.has_loss()) {
      throw std::runtime_error("training_step returned " + std::string(out.empty() ? "nothing" : "a dict without \"loss\"") +
                               " at batch " + std::to_string(batch_idx) +
                               "; under automatic optimization it must return the loss (or a dict holding \"loss\"), "
                               "or call set_automatic_optimization(false)");
    }
    strategy->backward(k > 1 ? out.loss() / k : out.loss());
  };
  if (!sync_now) {
    strategy->set_gradient_sync(false);
    closure();
    return;
  }
  strategy->set_gradient_sync(true);
  strategy->optimizer_step(optimizer, closure, [&] {
    model->on_before_optimizer_step(optimizer);
    clip_gradients(optimizer);
  });
  // As Lightning's optimizer.zero_grad() (PyTorch's set_to_none=True): the next
  // backward hands its gradients over instead of adding them to zeros.
  for (auto& group : optimizer.param_groups())
    for (auto& p : group.params()) p.mutable_grad() = at::Tensor();
  ++progress.global_step;
  step_schedulers("step");
}

void TrainerImpl::training_batch(const Batch& batch, int64_t batch_idx) {
  current_batch_size = batch_size_of(batch);
  strategy->on_train_batch_start(batch, batch_idx);
  model->on_train_batch_start(batch, batch_idx);
  StepOutput out;
  if (model->automatic_optimization()) {
    ++progress.accumulated;
    const bool sync_now = progress.accumulated >= accumulate_grad_batches || batch_idx + 1 == num_training_batches;
    optimizer_step_automatic(batch, batch_idx, out, sync_now);
    if (sync_now) progress.accumulated = 0;
  } else {
    in_training_step = true;
    out = strategy->training_step(batch, batch_idx);
    in_training_step = false;
  }
  log_step_metrics(false);
  // The batch is done before its end hooks run: a checkpoint that a hook
  // writes (ModelCheckpoint's every_n_train_steps) resumes after it, not
  // with it again.
  progress.batches_done = batch_idx + 1;
  model->on_train_batch_end(out, batch, batch_idx);
  for (auto& c : callbacks) c->on_train_batch_end(owner, *model, out, batch, batch_idx);
}

bool TrainerImpl::stop_requested(std::optional<StopPoll>& poll, bool force) {
  return poll && poll->poll(runtime::received_stop_signal() != 0, force);
}

Metrics TrainerImpl::evaluation_loop(Stage eval_stage, BatchSource& source, int64_t max_batches) {
  const bool is_val = eval_stage == Stage::kValidate || eval_stage == Stage::kSanityCheck;
  ResultCollection saved = std::move(results);
  results = ResultCollection();
  const bool was_training = model->is_training();
  model->eval();
  if (is_val) {
    for (auto& c : callbacks) c->on_validation_start(owner, *model);
    model->on_validation_epoch_start();
    for (auto& c : callbacks) c->on_validation_epoch_start(owner, *model);
  } else {
    for (auto& c : callbacks) c->on_test_start(owner, *model);
  }
  {
    auto stream = source.open(0);
    for (int64_t i = 0; i < max_batches; ++i) {
      auto batch = stream->next();
      if (!batch) break;
      current_batch_size = batch_size_of(*batch);
      if (is_val) {
        strategy->validation_step(*batch, i);
        for (auto& c : callbacks) c->on_validation_batch_end(owner, *model, i);
      } else {
        strategy->test_step(*batch, i);
        for (auto& c : callbacks) c->on_test_batch_end(owner, *model, i);
      }
      if (stop_requested(eval_poll, false)) {
        stop_agreed = true;
        break;
      }
    }
  }
  if (stop_agreed) {
    // Stopped by a signal part-way: no epoch end, so nothing (ModelCheckpoint,
    // EarlyStopping) acts on a partial evaluation; only the callbacks' epoch-end hooks run,
    // which undo what their start hooks changed in the module (WeightAveraging's swap).
    if (is_val)
      for (auto& c : callbacks) c->on_validation_epoch_end(owner, *model);
    if (was_training) model->train();
    results = std::move(saved);
    return {};
  }
  if (is_val) {
    model->on_validation_epoch_end();
    for (auto& c : callbacks) c->on_validation_epoch_end(owner, *model);
  } else {
    model->on_test_epoch_end();
  }
  auto values = results.epoch_values(reducer());
  const Metrics metrics = to_doubles(values);
  if (!sanity_checking) log_epoch_metrics(values, metrics, progress.global_step);
  if (is_val) {
    if (!sanity_checking)
      for (auto& c : callbacks) c->on_validation_end(owner, *model);
  } else {
    for (auto& c : callbacks) c->on_test_end(owner, *model);
  }
  if (was_training) model->train();
  results = std::move(saved);
  return metrics;
}
namespace {

// The DataLoader that yields `source`'s batches (inside DeviceLoaders), or nullptr.
const DataLoader* underlying_data_loader(const BatchSource& source) {
  if (const auto* device = dynamic_cast<const DeviceLoader*>(&source)) return underlying_data_loader(*device->inner());
  return dynamic_cast<const DataLoader*>(&source);
}

}  // namespace

void TrainerImpl::predict_loop(BatchSource& source, int64_t max_batches) {
  model->eval();
  predictions.clear();
  predict_batch_indices.clear();
  const DataLoader* data_loader = underlying_data_loader(source);
  const std::vector<std::vector<int64_t>> indices =
      data_loader ? data_loader->batch_indices() : std::vector<std::vector<int64_t>>();
  for (auto& c : callbacks) c->on_predict_start(owner, *model);
  {
    auto stream = source.open(0);
    for (int64_t i = 0; i < max_batches; ++i) {
      auto batch = stream->next();
      if (!batch) break;
      predictions.push_back(strategy->predict_step(*batch, i).to(torch::kCPU));
      predict_batch_indices.push_back(static_cast<size_t>(i) < indices.size() ? indices[i] : std::vector<int64_t>());
      for (auto& c : callbacks) c->on_predict_batch_end(owner, *model, predictions.back(), *batch, i);
    }
  }
  for (auto& c : callbacks) c->on_predict_epoch_end(owner, *model);
  for (auto& c : callbacks) c->on_predict_end(owner, *model);
}

void TrainerImpl::fit_loop() {
  const int64_t available = train_source->num_batches();
  num_training_batches = resolved.batches(options.limit_train_batches(), available, "limit_train_batches");
  const int64_t val_batches =
      val_source ? resolved.batches(options.limit_val_batches(), val_source->num_batches(), "limit_val_batches") : 0;
  num_val_batches = val_batches;
  const BatchLimit& vci = options.val_check_interval();
  int64_t val_every = num_training_batches;
  if (vci.is_fraction()) {
    val_every = std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(num_training_batches) * vci.value()));
  } else {
    val_every = static_cast<int64_t>(vci.value());
    if (val_every > num_training_batches && val_source) {
      throw std::invalid_argument("val_check_interval=" + std::to_string(val_every) + " is more than the " +
                                  std::to_string(num_training_batches) + " training batches of an epoch");
    }
  }

  // Over a copy: LearningRateFinder's on_fit_start runs steps with its test as the only
  // callback (run_probe), which swaps this list while the loop walks it.
  for (auto& c : std::vector<std::shared_ptr<Callback>>(callbacks)) c->on_fit_start(owner, *model);
  model->on_fit_start();
  // Where this fit's last.ckpt goes (resolved by on_fit_start), for a restart
  // of the launch to resume from.
  if (auto* mc = owner.checkpoint_callback(); mc && strategy->is_global_zero()) record_checkpoint_folder(mc->dirpath());

  if (val_source && val_batches > 0 && progress.global_step == 0 && resolved.limit_overrides == 0) {
    const int64_t n = options.num_sanity_val_steps() == -1 ? val_batches : std::min(options.num_sanity_val_steps(), val_batches);
    if (n > 0) {
      sanity_checking = true;
      evaluation_loop(Stage::kSanityCheck, *val_source, n);
      sanity_checking = false;
    }
  }

  for (auto& c : callbacks) c->on_train_start(owner, *model);
  auto done = [&] {
    if (options.max_steps() != -1 && progress.global_step >= options.max_steps()) return true;
    if (resolved.max_epochs != -1 && progress.epoch >= resolved.max_epochs) return true;
    return should_stop && progress.epoch >= options.min_epochs();
  };

  while (!done()) {
    if (num_training_batches == 0) break;
    train_source->set_epoch(progress.epoch);
    if (val_source) val_source->set_epoch(progress.epoch);
    model->train();
    results.reset();
    // A run resumed from a checkpoint written after the epoch's last batch
    // (by its end hook) has no batch left: it goes on to the epoch's end.
    progress.epoch_finished = progress.batches_done >= num_training_batches;
    progress.epoch_schedulers_stepped = false;
    for (auto& c : callbacks) c->on_train_epoch_start(owner, *model);
    model->on_train_epoch_start();
    bool interrupted = stop_agreed;  // during the sanity check
    if (!interrupted) {
      auto stream = train_source->open(progress.batches_done);
      for (int64_t batch_idx = progress.batches_done; batch_idx < num_training_batches; ++batch_idx) {
        auto batch = stream->next();
        if (!batch) break;
        training_batch(*batch, batch_idx);
        const bool last = batch_idx + 1 == num_training_batches;
        const bool check_val = val_source && val_batches > 0 &&
                               (progress.epoch + 1) % options.check_val_every_n_epoch() == 0 &&
                               ((batch_idx + 1) % val_every == 0 || (last && vci.is_fraction()));
        if (last) progress.epoch_finished = true;
        if (check_val) evaluation_loop(Stage::kValidate, *val_source, val_batches);
        if (stop_agreed || stop_requested(train_poll, last)) {
          interrupted = true;
          break;
        }
        if (options.max_steps() != -1 && progress.global_step >= options.max_steps()) break;
        if (should_stop && progress.epoch >= options.min_epochs()) break;
      }
    }
    if (interrupted) {
      const int sig = runtime::received_stop_signal() ? runtime::received_stop_signal() : SIGTERM;
      // last.ckpt only where checkpointing is on (a ModelCheckpoint, the default one or the
      // user's); with enable_checkpointing(false) or fast_dev_run nothing is written.
      std::string saved = "no checkpoint written (checkpointing is off)", report = saved;
      if (auto* mc = owner.checkpoint_callback()) {
        const std::string path =
            (mc->dirpath().empty() ? owner.log_dir() + "/checkpoints" : mc->dirpath()) + "/last.ckpt";
        owner.save_checkpoint(path);
        saved = "checkpoint saved to " + path;
        report = "last checkpoint " + path;
      }
      const std::string signal = "signal " + std::to_string(sig);
      runtime::log_rank_zero(runtime::LogLevel::kWarning,
                             "stopping at step " + std::to_string(progress.global_step) + " on " + signal + "; " + saved);
      if (strategy->is_global_zero())
        for (auto& l : loggers) l->finalize("interrupted");
      report_fit_end(signal + " (" + signal_name(sig) + "); " + report);
      throw WorkerFailure("interrupted by " + signal + " at step " + std::to_string(progress.global_step) + "; " + saved,
                          static_cast<int>(strategy->global_rank()), 128 + sig);
    }
    // Epoch end: aggregates, hooks, then the next epoch.
    auto values = results.epoch_values(reducer());
    log_epoch_metrics(values, to_doubles(values), progress.global_step);
    model->on_train_epoch_end();
    for (auto& c : callbacks) c->on_train_epoch_end(owner, *model);
    log_step_metrics(true);
    step_schedulers("epoch");
    progress.epoch_schedulers_stepped = true;
    if (!progress.epoch_finished) break;  // stopped mid-epoch (max_steps or should_stop)
    ++progress.epoch;
    progress.batches_done = 0;
  }
  for (auto& c : callbacks) c->on_train_end(owner, *model);
  model->on_fit_end();
  for (auto& c : callbacks) c->on_fit_end(owner, *model);
  strategy->on_train_end();
  if (strategy->is_global_zero()) {
    for (auto& l : loggers) {
      l->save();
      l->finalize("success");
    }
  }
  report_fit_end(fit_stop_reason());
}

std::string TrainerImpl::fit_stop_reason() const {
  if (num_training_batches == 0) return "no training batches (limit_train_batches gives 0)";
  if (options.max_steps() != -1 && progress.global_step >= options.max_steps()) {
    return "max_steps=" + std::to_string(options.max_steps()) + " reached";
  }
  if (should_stop) {
    if (auto* es = find_callback<EarlyStopping>(callbacks); es && es->stopped_epoch() == progress.epoch - (progress.epoch_finished ? 1 : 0)) {
      const std::string& monitor = es->options().monitor();
      std::string why = "EarlyStopping on " + monitor;
      if (auto it = callback_metrics.find(monitor); it != callback_metrics.end()) why += "=" + format_metric(it->second);
      return why + (es->reason().empty() ? " (the decision of another rank)" : " (" + es->reason() + ")");
    }
    if (auto* timer = find_callback<Timer>(callbacks); timer && !timer->reason().empty()) return timer->reason();
    return "should_stop was set";
  }
  if (resolved.max_epochs != -1 && progress.epoch >= resolved.max_epochs) {
    return "max_epochs=" + std::to_string(resolved.max_epochs) + " reached";
  }
  return "the training loader ran out";
}

}  // namespace fulgur::detail

