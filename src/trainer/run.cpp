// SPDX-License-Identifier: Apache-2.0
// One stage's run: launched on every rank by the strategy's launcher, and in
// each worker the setup before the loops, as Lightning's Trainer._run: the
// guards that undo the run's changes, seeding, the stage's loaders (the data
// connector), the strategy's setup, the restore, the stop signals, then the
// stage's loop.

#include <fulgur/data/data_loader.h>
#include <fulgur/data_module.h>
#include <fulgur/launchers/launcher.h>
#include <fulgur/lightning_module.h>
#include <fulgur/strategies/strategy.h>
#include <fulgur/trainer.h>

#include "launchers/restarts.h"
#include "runtime/log.h"
#include "runtime/memory.h"
#include "runtime/threads.h"
#include "trainer/connectors/signal_connector.h"
#include "trainer/trainer_impl.h"
#include "xla/pjrt/compile_cache.h"

#include <torch/torch.h>

#include <exception>
#include <filesystem>
#include <stdexcept>

namespace fulgur::detail {
namespace {

// Compiled XLA programs are kept beside the run's other files, for the workers of the next
// stages (each compiles the same graphs again otherwise); FULGUR_XLA_CACHE_DIR overrides. A
// stage run in this process (one device, no launcher) leaves no default behind it, so that
// later compiles outside a Trainer do not write into this run's folder; declared before the
// teardown, so that the teardown's graphs (the module moved back) are cached too.
struct CompileCacheDefault {
  explicit CompileCacheDefault(const std::string& root) {
    xla::pjrt::set_default_compile_cache_dir((std::filesystem::path(root) / ".xla_cache").string());
  }
  ~CompileCacheDefault() { xla::pjrt::set_default_compile_cache_dir(""); }
};

// The module's trainer() for the stage; after it, detached, and the fit's loaders dropped.
struct AttachedModel {
  TrainerImpl& t;
  AttachedModel(TrainerImpl& trainer, LightningModule& model) : t(trainer) { TrainerImpl::attach(model, &t.owner); }
  ~AttachedModel() {
    TrainerImpl::attach(*t.model, nullptr);
    t.fit_loop.train_source.reset();
    t.fit_loop.val_source.reset();
  }
};

// A stage that throws still tears down; if that fails too (a module whose values a failed
// device execution never produced cannot move back), the stage's own error goes on and the
// teardown's is logged, since a second exception while unwinding would end the process.
struct Teardown {
  Strategy* s;
  int exceptions = std::uncaught_exceptions();
  ~Teardown() noexcept(false) {
    if (std::uncaught_exceptions() <= exceptions) {
      s->teardown();
      return;
    }
    try {
      s->teardown();
    } catch (const std::exception& e) {
      runtime::log(runtime::LogLevel::kWarning,
                   std::string("the strategy's teardown after the stage's error failed as well: ") + e.what());
    }
  }
};

// A stage that throws: rank 0's logger writes the rows it still holds, as
// Lightning's finalize("failed"). An error while doing so must not hide the
// stage's own, which is already on its way.
struct FinalizeOnFailure {
  TrainerImpl* self;
  int exceptions = std::uncaught_exceptions();
  ~FinalizeOnFailure() {
    if (std::uncaught_exceptions() <= exceptions || !self->strategy->is_global_zero()) return;
    for (auto& l : self->loggers) {
      try {
        l->finalize("failed");
      } catch (...) {
      }
    }
  }
};

}  // namespace

c10::IValue TrainerImpl::run_in_worker(Stage run_stage, LightningModule& m, StageData data, const std::string& ckpt_path) {
  stage = run_stage;
  model = &m;
  CompileCacheDefault compile_cache_default{options.default_root_dir()};
  AttachedModel attached{*this, m};
  SignalConnector signals;  // installed by run_fit, after the restore
  fit_loop.reset(std::nullopt);
  evaluation_loop.reset(std::nullopt);
  runtime::apply_malloc_policy();
  strategy->setup_environment();
  // Messages of this stage take the ranks from the strategy's environment.
  runtime::RankScope log_ranks(strategy->global_rank(), strategy->world_size());
  Teardown teardown{strategy.get()};
  FinalizeOnFailure finalize_on_failure{this};
  if (options.seed()) seed_everything(*options.seed());
  if (options.deterministic()) at::globalContext().setDeterministicAlgorithms(true, false);
  data_connector.load(data);
  setup_stage();
  std::string path = checkpoints.resolve_ckpt_path(ckpt_path);
  if (run_stage == Stage::kFit) {
    if (restart_count() > 0) path = checkpoints.resume_after_restart(path);
    run_fit(data, path, signals);
  } else {
    run_evaluation(data, path);
  }
  return make_result(predict_loop.predictions());
}

void TrainerImpl::setup_stage() {
  strategy->setup(owner);
  fit_loop.epoch_loop.automatic.set_accumulate_grad_batches(options.accumulate_grad_batches());
  for (auto& c : callbacks) c->setup(owner, *model, stage);
  // Every version before any logger writes: loggers on one root_dir and name share version_<N>.
  if (strategy->is_global_zero())
    for (auto& l : loggers) l->version();
  progress.scheduler_counts.assign(strategy->optimizer_config().schedulers.size(), 0);
  logging.results.reset();
  logging.pending_callback_metrics.clear();
  logging.callback_metrics.clear();
  logging.progress_bar_metrics.clear();
  fit_loop.set_should_stop(false);
  predict_loop.clear();
}

void TrainerImpl::run_fit(const StageData& data, const std::string& ckpt_path, SignalConnector& signals) {
  data_connector.attach_fit_loaders(data);
  progress.epoch = 0;
  progress.global_step = 0;
  progress.batches_done = 0;
  progress.accumulated = 0;
  if (!ckpt_path.empty()) checkpoints.restore(ckpt_path);
  signals.install(*this);
  if (strategy->is_global_zero())
    for (auto& l : loggers) l->log_hyperparams(model->hparams());
  fit_loop.run();
}

void TrainerImpl::run_evaluation(const StageData& data, const std::string& ckpt_path) {
  data_connector.require_eval_loader(data);
  if (!ckpt_path.empty()) checkpoints.restore(ckpt_path);
  const DataConnector::EvalSource eval = data_connector.eval_source(data);
  if (stage == Stage::kPredict) {
    predict_loop.run(*eval.source, eval.batches);
    return;
  }
  auto metrics = evaluation_loop.run(stage, *eval.source, eval.batches);
  for (const auto& [k, v] : metrics) logging.callback_metrics[k] = v;
  if (strategy->is_global_zero())
    for (auto& l : loggers) l->save();
}

c10::IValue TrainerImpl::run(Stage run_stage, LightningModule& m, StageData data, const std::string& ckpt_path) {
  Launcher* launcher = strategy->launcher();
  if (launcher && launcher->creates_processes() && launched_once && run_stage == Stage::kFit && !is_fulgur_worker()) {
    throw std::logic_error("Trainer::fit was called a second time on a Trainer whose strategy starts processes; "
                           "create a new Trainer for a second fit");
  }
  strategy->connect(m);
  model = &m;
  bool ran_here = false;
  WorkerFn fn = [&]() -> c10::IValue {
    ran_here = true;
    return run_in_worker(run_stage, m, data, ckpt_path);
  };
  c10::IValue result = launcher ? launcher->launch(fn) : fn();
  if (run_stage == Stage::kFit) launched_once = true;
  if (!ran_here) apply_result(result);
  return result;
}

}  // namespace fulgur::detail
