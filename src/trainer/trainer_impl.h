// SPDX-License-Identifier: Apache-2.0
#pragma once
// The Trainer's state (private to the library): the options, the strategy,
// callbacks and loggers, the loop position (Progress), and as members the
// loops (loops/, each owning its flags) and the connectors (connectors/:
// data, checkpoints, logging). The members are defined by concern: options.cpp (the
// constructor), run.cpp (run, run_in_worker), probe.cpp, worker_result.cpp;
// trainer.cpp is the façade.

#include <fulgur/callbacks/callback.h>
#include <fulgur/data/data_loader.h>
#include <fulgur/data_module.h>
#include <fulgur/lightning_module.h>
#include <fulgur/loggers/logger.h>
#include <fulgur/trainer.h>

#include <torch/optim/optimizer.h>

#include "trainer/connectors/checkpoint_connector.h"
#include "trainer/connectors/data_connector.h"
#include "trainer/connectors/logger_connector.h"
#include "trainer/loops/evaluation_loop.h"
#include "trainer/loops/fit_loop.h"
#include "trainer/loops/prediction_loop.h"
#include "trainer/progress.h"
#include "trainer/results.h"
#include "trainer/run_context.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace fulgur {
class Strategy;
}


namespace fulgur::detail {

// The first callback of type T, or nullptr.
template <typename T>
T* find_callback(const std::vector<std::shared_ptr<Callback>>& callbacks) {
  for (const auto& c : callbacks)
    if (auto* p = dynamic_cast<T*>(c.get())) return p;
  return nullptr;
}

// A metric's value in a message: six significant digits.
inline std::string format_metric(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.6g", v);
  return buf;
}

// The size of a batch for logging's weighted means: its data's first dimension, else 1.
inline int64_t batch_size_of(const Batch& batch) {
  return batch.data.defined() && batch.data.dim() > 0 ? batch.data.size(0) : 1;
}

// The values the loops read that the options only imply, resolved once by
// the constructor (options.cpp) so that nothing re-derives them later.
struct ResolvedOptions {
  // -1: no limit. Lightning's rule: max_epochs, else 1000 unless max_steps
  // is set; 1 under fast_dev_run.
  int64_t max_epochs = 1000;
  // fast_dev_run's batch count, which every loop runs; 0 = off.
  int64_t limit_overrides = 0;
  // Batches a loop runs out of `available`: fast_dev_run's count when set,
  // else `limit` (its option's name is `what`) resolved against `available`.
  int64_t batches(const BatchLimit& limit, int64_t available, const char* what) const {
    return limit_overrides > 0 ? std::min(limit_overrides, available) : limit.resolve(available, what);
  }
  // Set and > 0: clip at this value; else no clipping.
  std::optional<double> gradient_clip_val;
};

struct TrainerImpl;
class SignalConnector;

// The RunContext of a TrainerImpl (run_context(trainer) returns it).
class TrainerRunContext final : public RunContext {
 public:
  explicit TrainerRunContext(TrainerImpl& impl) : impl_(impl) {}
  Stage stage() const override;
  void log(const std::string& name, const at::Tensor& value, const LogOptions& options) override;
  void optimizer_step(torch::optim::Optimizer& optimizer, const std::function<void()>& closure) override;
  const std::vector<at::Tensor>& predictions() const override;
  const std::vector<std::vector<int64_t>>& predict_batch_indices() const override;
  void run_probe(Callback& probe, int64_t max_steps) override;
  void reconfigure_optimizers() override;

 private:
  TrainerImpl& impl_;
};

struct TrainerImpl {
  TrainerImpl(Trainer& owner, TrainerOptions options);

  // Sets `model`'s trainer() (nullptr: detached).
  static void attach(LightningModule& model, Trainer* trainer) { model.trainer_ = trainer; }

  // Runs `stage` on every rank (launching workers if the strategy does) and
  // brings rank 0's results back into this process.
  c10::IValue run(Stage stage, LightningModule& model, StageData data, const std::string& ckpt_path);

  // --- inside a worker (run.cpp) ---
  // The guards, seeding, the stage's loaders, setup_stage, and run_fit or run_evaluation.
  c10::IValue run_in_worker(Stage stage, LightningModule& model, StageData data, const std::string& ckpt_path);
  // The strategy's and the callbacks' setup, the loggers' versions, and the run's counters and
  // metrics cleared.
  void setup_stage();
  // The fit's loaders, the restore from `ckpt_path` (if any), the stop signals (installed into
  // `signals`, which the caller keeps for the stage), FitLoop::run.
  void run_fit(const StageData& data, const std::string& ckpt_path, SignalConnector& signals);
  // validate, test or predict: the restore, the loader after its limit, the stage's loop.
  void run_evaluation(const StageData& data, const std::string& ckpt_path);
  // RunContext::run_probe and reconfigure_optimizers (probe.cpp).
  void run_probe(Callback& probe, int64_t max_steps);
  void probe_epochs(int64_t max_steps);
  void reconfigure_optimizers();

  // --- results travelling from rank 0 to the launching process ---
  c10::IValue make_result(const std::vector<at::Tensor>& predictions);
  void apply_result(const c10::IValue& result);

  Trainer& owner;
  TrainerRunContext context{*this};
  TrainerOptions options;
  ResolvedOptions resolved;
  // Resolved once by the constructor from `strategy`, `callbacks` (with the
  // enable_* defaults) and `logger`.
  std::shared_ptr<Strategy> strategy;
  std::vector<std::shared_ptr<Callback>> callbacks;
  // Rank 0 calls each, in order; empty with logger(false) or fast_dev_run.
  std::vector<std::shared_ptr<Logger>> loggers;

  LightningModule* model = nullptr;
  Stage stage = Stage::kFit;
  // The epoch, step, resume position, micro-batches and scheduler counts (progress.h).
  Progress progress;
  // The loops (Lightning's fit_loop, validate/test loop and predict_loop); fit's
  // validation runs through evaluation_loop too.
  FitLoop fit_loop{*this};
  EvaluationLoop evaluation_loop{*this};
  PredictionLoop predict_loop{*this};
  // The stage's loaders as the strategy serves them, and their limits.
  DataConnector data_connector{*this};
  // Dump, restore and ckpt_path (connectors/checkpoint_connector.h).
  CheckpointConnector checkpoints{*this};
  // LightningModule::log, the logged values and metrics, rows to the loggers.
  LoggerConnector logging{*this};
  // A fit has been launched: a strategy that starts processes refuses a second.
  bool launched_once = false;
};

}  // namespace fulgur::detail
