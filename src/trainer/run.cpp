// SPDX-License-Identifier: Apache-2.0
// One stage's run: launched on every rank by the strategy's launcher, and in
// each worker the setup before the loops (seeding, the DataModule's loaders,
// the strategy's setup, the restore, the stop signals), as Lightning's
// Trainer._run.

#include <fulgur/data/data_loader.h>
#include <fulgur/data_module.h>
#include <fulgur/launchers/launcher.h>
#include <fulgur/lightning_module.h>
#include <fulgur/strategies/strategy.h>
#include <fulgur/trainer.h>

#include "launchers/restarts.h"
#include "runtime/log.h"
#include "runtime/memory.h"
#include "runtime/signals.h"
#include "runtime/threads.h"
#include "trainer/trainer_impl.h"
#include "xla/pjrt/compile_cache.h"

#include <torch/torch.h>

#include <chrono>
#include <exception>
#include <filesystem>
#include <stdexcept>

namespace fulgur::detail {

std::string TrainerImpl::resume_after_restart(const std::string& ckpt_path) {
  // Rank 0 reads the records in node 0's launch folder; every rank restores the same file.
  const std::string mine = strategy->is_global_zero() ? last_checkpoint_of_this_launch() : "";
  const std::string found = strategy->broadcast(c10::IValue(mine), 0).toStringRef();
  const std::string which = "restart " + std::to_string(restart_count()) + " of the launch: ";
  if (!found.empty()) {
    runtime::log_rank_zero(runtime::LogLevel::kInfo, which + "resuming from " + found);
    return found;
  }
  runtime::log_rank_zero(runtime::LogLevel::kWarning,
                         which + "no earlier attempt wrote a last.ckpt; starting " +
                             (ckpt_path.empty() ? std::string("from scratch") : "from " + ckpt_path) + " again");
  return ckpt_path;
}

c10::IValue TrainerImpl::run_in_worker(Stage run_stage, LightningModule& m, StageData data, const std::string& ckpt_path) {
  stage = run_stage;
  model = &m;
  // Compiled XLA programs are kept beside the run's other files, for the workers of the next
  // stages (each compiles the same graphs again otherwise); FULGUR_XLA_CACHE_DIR overrides. A
  // stage run in this process (one device, no launcher) leaves no default behind it, so that
  // later compiles outside a Trainer do not write into this run's folder; declared before the
  // teardown below, so that the teardown's graphs (the module moved back) are cached too.
  struct CompileCacheDefault {
    explicit CompileCacheDefault(const std::string& root) {
      xla::pjrt::set_default_compile_cache_dir((std::filesystem::path(root) / ".xla_cache").string());
    }
    ~CompileCacheDefault() { xla::pjrt::set_default_compile_cache_dir(""); }
  } compile_cache_default{options.default_root_dir()};
  attach(m, &owner);
  struct Detach {
    TrainerImpl* self;
    ~Detach() {
      attach(*self->model, nullptr);
      self->fit_loop.train_source.reset();
      self->fit_loop.val_source.reset();
    }
  } detach{this};
  // Installed once the rendezvous and the restore are done, as Lightning
  // registers its handlers: until then SIGTERM and SIGINT keep their default
  // action and end the worker at once, wherever it waits.
  std::optional<runtime::StopSignalGuard> signals;
  fit_loop.reset(std::nullopt);
  evaluation_loop.reset(std::nullopt);
  runtime::apply_malloc_policy();

  strategy->setup_environment();
  // Messages of this stage take the ranks from the strategy's environment.
  runtime::RankScope log_ranks(strategy->global_rank(), strategy->world_size());
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
  } teardown{strategy.get()};
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
  } finalize_on_failure{this};
  if (options.seed()) seed_everything(*options.seed());
  if (options.deterministic()) at::globalContext().setDeterministicAlgorithms(true, false);
  if (data.datamodule) {
    data.datamodule->setup(to_string(run_stage));
    if (run_stage == Stage::kFit) {
      data.train = data.datamodule->train_dataloader();
      data.val = data.datamodule->val_dataloader();
    } else if (run_stage == Stage::kValidate) {
      data.eval = data.datamodule->val_dataloader();
    } else if (run_stage == Stage::kTest) {
      data.eval = data.datamodule->test_dataloader();
    } else {
      data.eval = data.datamodule->predict_dataloader();
    }
  }
  strategy->setup(owner);
  fit_loop.epoch_loop.automatic.reset(options.accumulate_grad_batches());
  for (auto& c : callbacks) c->setup(owner, m, run_stage);
  // Every version before any logger writes: loggers on one root_dir and name share version_<N>.
  if (strategy->is_global_zero())
    for (auto& l : loggers) l->version();
  progress.scheduler_counts.assign(strategy->optimizer_config().schedulers.size(), 0);
  results.reset();
  pending_callback_metrics.clear();
  callback_metrics.clear();
  progress_bar_metrics.clear();
  fit_loop.set_should_stop(false);

  predict_loop.clear();
  std::string path = resolve_ckpt_path(ckpt_path);
  if (run_stage == Stage::kFit && restart_count() > 0) path = resume_after_restart(path);
  if (run_stage == Stage::kFit) {
    if (!data.train) throw std::invalid_argument("fit: no training loader (pass one, or give the DataModule a train_dataloader)");
    fit_loop.train_source = strategy->process_dataloader(data.train);
    fit_loop.val_source = data.val ? strategy->process_dataloader(data.val) : nullptr;
    progress.epoch = 0;
    progress.global_step = 0;
    progress.batches_done = 0;
    progress.accumulated = 0;
    if (!path.empty()) restore(path);
    if (options.handle_signals()) {
      signals.emplace(is_fulgur_worker() ? runtime::SecondSignal::kRecorded : runtime::SecondSignal::kExits);
      StopPoll::Agree agree;
      if (strategy->world_size() > 1) {
        agree = [this](bool local, double seconds) {
          const at::Tensor t = strategy->reduce(torch::tensor({local ? 1.0 : 0.0, seconds}, torch::kFloat64), "max");
          return std::make_pair(t[0].item<double>() > 0, t[1].item<double>());
        };
      }
      // Agreements about a quarter of a second apart: a signal is acted on
      // well within a second unless one batch takes longer than that.
      constexpr std::chrono::milliseconds kStopAgreeEvery{250};
      fit_loop.reset(StopPoll(agree, kStopAgreeEvery));
      evaluation_loop.reset(StopPoll(agree, kStopAgreeEvery));
    }
    if (strategy->is_global_zero())
      for (auto& l : loggers) l->log_hyperparams(model->hparams());
    fit_loop.run();
  } else {
    if (!data.eval) {
      throw std::invalid_argument(std::string(to_string(run_stage)) + ": no loader (pass one, or give the DataModule a " +
                                  (run_stage == Stage::kValidate ? "val" : to_string(run_stage)) + "_dataloader)");
    }
    if (!path.empty()) restore(path);
    auto source = strategy->process_dataloader(data.eval);
    const BatchLimit& limit = run_stage == Stage::kValidate ? options.limit_val_batches()
                              : run_stage == Stage::kTest   ? options.limit_test_batches()
                                                            : options.limit_predict_batches();
    const char* what = run_stage == Stage::kValidate ? "limit_val_batches"
                       : run_stage == Stage::kTest   ? "limit_test_batches"
                                                     : "limit_predict_batches";
    const int64_t n = resolved.batches(limit, source->num_batches(), what);
    if (run_stage == Stage::kPredict) {
      predict_loop.run(*source, n);
    } else {
      auto metrics = evaluation_loop.run(run_stage, *source, n);
      for (const auto& [k, v] : metrics) callback_metrics[k] = v;
      if (strategy->is_global_zero())
        for (auto& l : loggers) l->save();
    }
  }
  return make_result(predict_loop.predictions());
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

