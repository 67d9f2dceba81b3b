// SPDX-License-Identifier: Apache-2.0
// A probe inside a fit (RunContext::run_probe): training steps with one callback of the library's
// (LearningRateFinder's range test), after which the fit starts as if they had not been taken, as
// Lightning's _lr_find runs its nested fit_loop and then restores the checkpoint it saved before.

#include <fulgur/callbacks/callback.h>
#include <fulgur/checkpoint.h>
#include <fulgur/plugins/precision/precision.h>
#include <fulgur/strategies/strategy.h>
#include <fulgur/xla/random.h>

#include "trainer/trainer_impl.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <stdexcept>
#include <utility>

namespace fulgur::detail {

void TrainerImpl::reconfigure_optimizers() {
  if (stage != Stage::kFit || progress.global_step != 0) {
    throw std::logic_error("reconfigure_optimizers: only in a fit before its first optimizer step (global_step=" +
                           std::to_string(progress.global_step) + ")");
  }
  strategy->setup_optimizers();
  progress.scheduler_counts.assign(strategy->optimizer_config().schedulers.size(), 0);
}

// Epochs of the training batches (limit_train_batches of them each) until `max_steps` optimizer
// steps, a stop (should_stop), or an epoch that took no step (an empty loader, or manual
// optimization that does not step). The fit's max_epochs does not bound them: the probe needs
// its steps, as lr_find's Trainer of its own runs with max_epochs(-1).
void TrainerImpl::probe_epochs(int64_t max_steps) {
  const int64_t batches = fit_loop.num_training_batches();
  auto& train_source = *fit_loop.train_source;
  for (auto& c : callbacks) c->on_train_start(owner, *model);
  for (int64_t epoch = 0;; ++epoch) {
    if (batches == 0 || progress.global_step >= max_steps || fit_loop.should_stop()) return;
    const int64_t steps_before = progress.global_step;
    progress.epoch = epoch;
    train_source.set_epoch(epoch);
    model->train();
    for (auto& c : callbacks) c->on_train_epoch_start(owner, *model);
    model->on_train_epoch_start();
    auto stream = train_source.open(0);
    for (int64_t i = 0; i < batches; ++i) {
      auto batch = stream->next();
      if (!batch) break;
      fit_loop.epoch_loop.run_batch(*batch, i, i + 1 == batches);
      if (progress.global_step >= max_steps || fit_loop.should_stop()) return;
    }
    if (progress.global_step == steps_before) return;
  }
}

void TrainerImpl::run_probe(Callback& probe, int64_t max_steps) {
  if (stage != Stage::kFit || progress.global_step != 0 || !fit_loop.train_source) {
    throw std::logic_error("run_probe: only at the start of a fit at step 0 (global_step=" + std::to_string(progress.global_step) + ")");
  }
  // What the steps change: the weights (CPU copies), the generators, the precision plugin's state
  // (a GradScaler's scale) and the loop's progress.
  const Progress start = progress;
  const c10::Dict<std::string, c10::IValue> weights = state_dict(*model);
  const at::Tensor cpu_rng = at::detail::getDefaultCPUGenerator().get_state();
  const auto params = model->parameters();
  const bool on_xla = !params.empty() && params.front().device().type() == c10::kLazy;
  const at::Tensor xla_rng = on_xla ? xla::rng_state() : at::Tensor();
  const auto precision_state = strategy->precision().state_dict();
  const int64_t logged_step = logging.last_logged_step;
  // The probe is the only callback (the caller owns it); nothing is logged; the module's
  // schedulers stay still, since the probe sets the rate of every step itself.
  auto own_callbacks = std::exchange(callbacks, {std::shared_ptr<Callback>(&probe, [](Callback*) {})});
  auto own_loggers = std::exchange(loggers, {});
  fit_loop.epoch_loop.pause_schedulers(true);
  auto put_back = [&] {
    callbacks = std::move(own_callbacks);
    loggers = std::move(own_loggers);
    fit_loop.epoch_loop.pause_schedulers(false);
    torch::NoGradGuard no_grad;
    load_state_dict(*model, weights, true, "the weights before the probe");
    for (auto& p : model->parameters()) p.mutable_grad() = at::Tensor();
    at::Generator cpu_generator = at::detail::getDefaultCPUGenerator();
    cpu_generator.set_state(cpu_rng);
    if (on_xla) xla::set_rng_state(xla_rng);
    if (precision_state) strategy->precision().load_state_dict(*precision_state, "the precision state before the probe");
    progress = start;
    fit_loop.set_should_stop(false);
    logging.last_logged_step = logged_step;
    logging.results.reset();
    logging.callback_metrics.clear();
    logging.pending_callback_metrics.clear();
    logging.progress_bar_metrics.clear();
    logging.pending_prog_bar.clear();
    // Fresh optimizers, as configure_optimizers made them at the fit's start: their state
    // (momentum, Adam's moments) and their schedulers' counts are the probe's otherwise.
    reconfigure_optimizers();
  };
  try {
    probe_epochs(max_steps);
  } catch (...) {
    put_back();
    throw;
  }
  put_back();
}

}  // namespace fulgur::detail
