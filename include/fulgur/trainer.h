// SPDX-License-Identifier: Apache-2.0
#pragma once
// Trainer: runs fit / validate / test / predict of a LightningModule with a
// Strategy, callbacks and a logger.
//
// Example:
//   fulgur::Trainer trainer(fulgur::TrainerOptions()
//                               .accelerator("xla").devices("auto").strategy("xla")
//                               .max_epochs(1));
//   trainer.fit(model, datamodule);
//   auto metrics = trainer.test(model, datamodule);

#include <fulgur/checkpoint.h>

#include <torch/arg.h>

#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace fulgur {

class BatchSource;
class Callback;
class DataModule;
class LightningModule;
class Logger;
class ModelCheckpoint;
struct OptimizerConfig;
class Strategy;
class Trainer;
namespace detail {
struct TrainerImpl;
class RunContext;
// The library's own view of a running trainer (src/trainer/run_context.h).
RunContext& run_context(const Trainer& trainer);
}  // namespace detail

// How many batches of an epoch to use: a count (int) or a fraction (double).
class BatchLimit {
 public:
  BatchLimit(int value) : BatchLimit(static_cast<int64_t>(value)) {}  // NOLINT
  BatchLimit(int64_t count) : count_(count), fraction_(-1) {}        // NOLINT
  BatchLimit(double fraction) : count_(-1), fraction_(fraction) {}   // NOLINT
  // Batches to run out of `available`; throws std::invalid_argument naming
  // `what` for a negative count or a fraction outside [0, 1].
  int64_t resolve(int64_t available, const char* what) const;
  bool is_fraction() const { return fraction_ >= 0; }
  double value() const { return is_fraction() ? fraction_ : static_cast<double>(count_); }

 private:
  int64_t count_;
  double fraction_;
};

// A strategy by name or as a configured object (Lightning's
// strategy: Union[str, Strategy]).
// Example: strategy("ddp"), or strategy(std::make_shared<fulgur::DDPStrategy>(...)).
class StrategyChoice {
 public:
  StrategyChoice(std::string name) : name_(std::move(name)) {}            // NOLINT
  StrategyChoice(const char* name) : name_(name ? name : ""), null_(!name) {}  // NOLINT
  template <typename S, typename = std::enable_if_t<std::is_convertible_v<S*, Strategy*>>>
  StrategyChoice(std::shared_ptr<S> object) : object_(std::move(object)), null_(!object_) {}  // NOLINT
  // The configured object, or nullptr when a name was given.
  const std::shared_ptr<Strategy>& object() const { return object_; }
  // The name given ("" with an object).
  const std::string& name() const { return name_; }
  // A null object or a null name was given: the Trainer refuses it.
  bool is_null() const { return null_; }

 private:
  std::string name_;
  std::shared_ptr<Strategy> object_;
  bool null_ = false;
};

// Where the logged metrics go (Lightning's logger: Union[Logger,
// Iterable[Logger], bool]): true, a TensorBoardLogger and a CSVLogger in
// default_root_dir, sharing one version folder; false
// (or no loggers), none; a logger; or several.
// Example: logger(false), logger(std::make_shared<fulgur::CSVLogger>("runs")),
// logger({tensorboard, csv}).
class LoggerChoice {
 public:
  LoggerChoice(bool enabled) : default_logger_(enabled) {}  // NOLINT
  // Not a bool: a string or pointer here is a mistake, not `true`.
  LoggerChoice(const char*) = delete;
  template <typename L, typename = std::enable_if_t<std::is_convertible_v<L*, Logger*>>>
  LoggerChoice(std::shared_ptr<L> logger) : loggers_{std::move(logger)} {}  // NOLINT
  LoggerChoice(std::vector<std::shared_ptr<Logger>> loggers) : loggers_(std::move(loggers)) {}  // NOLINT
  LoggerChoice(std::initializer_list<std::shared_ptr<Logger>> loggers) : loggers_(loggers) {}  // NOLINT
  // logger(true): the Trainer makes a TensorBoardLogger and a CSVLogger in default_root_dir.
  bool default_logger() const { return default_logger_; }
  // The loggers given, in order (a null one is refused by the Trainer).
  const std::vector<std::shared_ptr<Logger>>& loggers() const { return loggers_; }

 private:
  bool default_logger_ = false;
  std::vector<std::shared_ptr<Logger>> loggers_;
};

struct TrainerOptions {
  // The other two forms of `devices` below (Lightning's devices=2 and
  // devices=[0, 1]); both set the string.
  // A count: devices(2) is devices("2").
  TrainerOptions& devices(int64_t n);
  // Device indices: devices(std::vector<int64_t>{0, 1}) is devices("0,1"),
  // and {1} is devices("1,") (index 1, not a count). Duplicates, negatives
  // and indices the accelerator does not have are refused by the Trainer's
  // constructor, naming the value and the range.
  TrainerOptions& devices(const std::vector<int64_t>& indices);

  // "cpu", "cuda" (or "gpu"), "xla" or "auto" (cuda when a GPU is visible, else xla).
  TORCH_ARG(std::string, accelerator) = "auto";
  // "auto", a count "2", or indices "0,1" (one index: "1,", as in Lightning);
  // or the int and vector forms above.
  TORCH_ARG(std::string, devices) = "auto";
  // A name: "auto", "single_device", "single_xla", "ddp", "xla", "xla_debug";
  // or a configured Strategy object, which overrides `accelerator`,
  // `devices`, `precision`, `num_nodes`, `start_method`, `max_restarts` and
  // `collective_timeout_ms` (the object has its own).
  TORCH_ARG(StrategyChoice, strategy) = "auto";
  // "32-true", "bf16-true", or "bf16-mixed" (autocast to bfloat16 with
  // float32 weights, on cpu, cuda and xla). See plugins/precision/precision.h.
  TORCH_ARG(std::string, precision) = "32-true";
  TORCH_ARG(int64_t, num_nodes) = 1;
  // -1: no limit. Unset: 1000 unless max_steps is set (Lightning's rule).
  TORCH_ARG(std::optional<int64_t>, max_epochs) = std::nullopt;
  TORCH_ARG(int64_t, min_epochs) = 0;
  // -1: no limit.
  TORCH_ARG(int64_t, max_steps) = -1;
  TORCH_ARG(BatchLimit, limit_train_batches) = 1.0;
  TORCH_ARG(BatchLimit, limit_val_batches) = 1.0;
  TORCH_ARG(BatchLimit, limit_test_batches) = 1.0;
  TORCH_ARG(BatchLimit, limit_predict_batches) = 1.0;
  // Validate every n training batches (count) or fraction of an epoch.
  TORCH_ARG(BatchLimit, val_check_interval) = 1.0;
  TORCH_ARG(int64_t, check_val_every_n_epoch) = 1;
  // Sum gradients of k batches, then step once.
  TORCH_ARG(int64_t, accumulate_grad_batches) = 1;
  TORCH_ARG(std::optional<double>, gradient_clip_val) = std::nullopt;
  // "norm" or "value".
  TORCH_ARG(std::string, gradient_clip_algorithm) = "norm";
  TORCH_ARG(int64_t, num_sanity_val_steps) = 2;
  TORCH_ARG(int64_t, log_every_n_steps) = 50;
  TORCH_ARG(std::string, default_root_dir) = ".";
  TORCH_ARG(bool, enable_progress_bar) = true;
  TORCH_ARG(bool, enable_checkpointing) = true;
  // Add a ModelSummary (rank 0 prints the model's table at fit start) if none is given.
  TORCH_ARG(bool, enable_model_summary) = true;
  // true: a TensorBoardLogger then a CSVLogger in default_root_dir; false:
  // none; a logger; or several
  // ({tensorboard, csv}, Lightning's logger=[...]). Rank 0 gives each every
  // logged metric and the hparams. The first one's log_dir is
  // Trainer::log_dir() and holds the checkpoints. Their versions are
  // resolved before any of them writes, so loggers on the same root_dir and
  // name share one version_<N> folder. None with fast_dev_run.
  TORCH_ARG(LoggerChoice, logger) = true;
  TORCH_ARG(std::vector<std::shared_ptr<Callback>>, callbacks) = {};
  // seed_everything(seed) on every rank before setup. The weights a module
  // draws in its constructor come earlier: call fulgur::seed_everything first
  // for a reproducible run. A DataLoader's shuffle order comes from its own
  // DataLoaderOptions::seed.
  TORCH_ARG(std::optional<uint64_t>, seed) = std::nullopt;
  TORCH_ARG(bool, deterministic) = false;
  // Run n batches of train/val/test once, no checkpoints or logs (0 = off).
  TORCH_ARG(int64_t, fast_dev_run) = 0;
  // Bound on each collective and on the rendezvous (ms).
  TORCH_ARG(int64_t, collective_timeout_ms) = 30 * 60 * 1000;
  // Launcher start method for multi-process strategies: "fork" or "spawn".
  TORCH_ARG(std::string, start_method) = "fork";
  // How many times a failed multi-process job (ddp, xla) is started again,
  // a fit resuming from the run's last.ckpt (torchrun's --max-restarts; see
  // MultiProcessLauncherOptions::max_restarts). Default 0. Negative, or more
  // than 0 with a strategy that runs in this process, is
  // std::invalid_argument from the constructor.
  TORCH_ARG(int64_t, max_restarts) = 0;
  // Stop the run on SIGTERM/SIGINT at the next step boundary, after a checkpoint.
  TORCH_ARG(bool, handle_signals) = true;
  // Under a parallel strategy, give each DataLoader a DistributedSampler (each
  // rank its share) and refuse any other BatchSource, which every rank would
  // use whole. false: every loader is used as given, so it must yield only
  // this rank's share itself (Lightning's use_distributed_sampler=False). A
  // strategy object decides by its ParallelOptions::use_distributed_sampler
  // (false here with true there is refused).
  TORCH_ARG(bool, use_distributed_sampler) = true;
};

// Metric name -> value.
using Metrics = std::map<std::string, double>;

class Trainer {
 public:
  // Resolves every option (accelerator, devices, strategy, precision, loop
  // bounds) now and throws std::invalid_argument naming a bad one, before
  // any process starts.
  explicit Trainer(TrainerOptions options = TrainerOptions());
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // ckpt_path: "" (fresh), "last", "best" or a file. Throws WorkerFailure when
  // a worker fails, and std::logic_error when called twice with a strategy
  // that starts processes.
  void fit(LightningModule& model, DataModule& datamodule, const std::string& ckpt_path = "");
  void fit(LightningModule& model, std::shared_ptr<BatchSource> train_loader,
           std::shared_ptr<BatchSource> val_loader = nullptr, const std::string& ckpt_path = "");
  Metrics validate(LightningModule& model, DataModule& datamodule, const std::string& ckpt_path = "");
  Metrics validate(LightningModule& model, std::shared_ptr<BatchSource> loader, const std::string& ckpt_path = "");
  Metrics test(LightningModule& model, DataModule& datamodule, const std::string& ckpt_path = "");
  Metrics test(LightningModule& model, std::shared_ptr<BatchSource> loader, const std::string& ckpt_path = "");
  // Rank 0's predictions, on the CPU (each rank predicts its share of the
  // loader). The DataModule form calls setup("predict") and
  // predict_dataloader() in every worker. To keep every rank's predictions,
  // add a BasePredictionWriter (callbacks/prediction_writer.h).
  std::vector<at::Tensor> predict(LightningModule& model, DataModule& datamodule, const std::string& ckpt_path = "");
  std::vector<at::Tensor> predict(LightningModule& model, std::shared_ptr<BatchSource> loader,
                                  const std::string& ckpt_path = "");

  // --- State, for callbacks and modules -------------------------------------
  const TrainerOptions& options() const;
  Strategy& strategy() const;
  int64_t current_epoch() const;
  int64_t global_step() const;
  bool should_stop() const;
  void set_should_stop(bool value);
  bool sanity_checking() const;
  bool is_global_zero() const;
  int64_t world_size() const;
  int64_t global_rank() const;
  // Batches per training epoch after limits (and per rank).
  int64_t num_training_batches() const;
  // Batches per validation run of fit after limits (and per rank); 0 without a validation loader.
  int64_t num_val_batches() const;
  int64_t max_epochs() const;
  int64_t max_steps() const;
  // Batches whose gradients are summed before each optimizer step in this epoch: the
  // accumulate_grad_batches option, or what a GradientAccumulationScheduler set for the epoch.
  int64_t accumulate_grad_batches() const;
  // Takes effect at the next accumulation window; call it at an epoch start, as
  // GradientAccumulationScheduler does. Throws std::invalid_argument for k < 1.
  void set_accumulate_grad_batches(int64_t k);
  // The latest value of every logged metric (epoch aggregates once the epoch ended).
  const Metrics& callback_metrics() const;
  const Metrics& progress_bar_metrics() const;
  // The first logger (nullptr without one), and all of them.
  const std::shared_ptr<Logger>& logger() const;
  const std::vector<std::shared_ptr<Logger>>& loggers() const;
  // <log_dir> of the first logger, or default_root_dir without one.
  std::string log_dir() const;
  const std::vector<std::shared_ptr<Callback>>& callbacks() const;
  // The first ModelCheckpoint callback, or nullptr.
  ModelCheckpoint* checkpoint_callback() const;
  const OptimizerConfig& optimizer_config() const;
  // Whole-run checkpoint dict as saved by save_checkpoint.
  Checkpoint dump_checkpoint();
  // All ranks call; rank 0 writes; followed by a barrier.
  void save_checkpoint(const std::string& path);

 private:
  friend detail::RunContext& detail::run_context(const Trainer& trainer);
  std::unique_ptr<detail::TrainerImpl> impl_;
};

// Seeds torch's default generator (and C's rand) in this process, CUDA's when fulgur starts
// CUDA, and the xla device generator (<fulgur/xla/random.h>: keyed with the seed and this
// process's global rank, so ranks draw different numbers).
void seed_everything(uint64_t seed);

}  // namespace fulgur
