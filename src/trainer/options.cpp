// SPDX-License-Identifier: Apache-2.0
// Option validation and strategy resolution: the Trainer's constructor
// checks every option and resolves the strategy, the callbacks and the
// loggers once, before any process starts.

#include <fulgur/callbacks/gradient_accumulation_scheduler.h>
#include <fulgur/callbacks/model_checkpoint.h>
#include <fulgur/callbacks/model_summary.h>
#include <fulgur/callbacks/progress_bar.h>
#include <fulgur/loggers/csv_logger.h>
#include <fulgur/loggers/tensorboard_logger.h>
#include <fulgur/strategies/parallel.h>
#include <fulgur/strategies/registry.h>
#include <fulgur/trainer.h>

#include "runtime/env_vars.h"
#include "runtime/log.h"
#include "trainer/trainer_impl.h"

#include <set>
#include <stdexcept>

namespace fulgur {

int64_t BatchLimit::resolve(int64_t available, const char* what) const {
  if (is_fraction()) {
    if (fraction_ < 0.0 || fraction_ > 1.0) {
      throw std::invalid_argument(std::string(what) + "=" + std::to_string(fraction_) +
                                  " is outside [0.0, 1.0]; give a fraction in that range or a batch count");
    }
    return static_cast<int64_t>(static_cast<double>(available) * fraction_);
  }
  if (count_ < 0) {
    throw std::invalid_argument(std::string(what) + "=" + std::to_string(count_) +
                                " is negative; give a batch count >= 0 or a fraction in [0.0, 1.0]");
  }
  return std::min(count_, available);
}

TrainerOptions& TrainerOptions::devices(int64_t n) {
  devices_ = std::to_string(n);
  return *this;
}

TrainerOptions& TrainerOptions::devices(const std::vector<int64_t>& indices) {
  std::string spec;
  for (int64_t i : indices) spec += std::to_string(i) + ",";
  if (indices.size() > 1) spec.pop_back();
  devices_ = indices.empty() ? "," : spec;
  return *this;
}

namespace detail {
namespace {

void require(bool ok, const std::string& message) {
  if (!ok) throw std::invalid_argument(message);
}

// The options' own ranges (and the environment's variables), before any process starts.
void check_options(const TrainerOptions& options) {
  require(options.max_epochs().value_or(0) >= -1,
          "max_epochs=" + std::to_string(options.max_epochs().value_or(0)) + " is invalid; use -1 (no limit) or >= 0");
  require(options.max_steps() >= -1, "max_steps=" + std::to_string(options.max_steps()) + " is invalid; use -1 or >= 0");
  require(options.min_epochs() >= 0, "min_epochs=" + std::to_string(options.min_epochs()) + " must be >= 0");
  require(options.accumulate_grad_batches() >= 1,
          "accumulate_grad_batches=" + std::to_string(options.accumulate_grad_batches()) + " must be >= 1");
  require(options.check_val_every_n_epoch() >= 1,
          "check_val_every_n_epoch=" + std::to_string(options.check_val_every_n_epoch()) + " must be >= 1");
  require(options.log_every_n_steps() >= 1,
          "log_every_n_steps=" + std::to_string(options.log_every_n_steps()) + " must be >= 1");
  require(options.num_sanity_val_steps() >= -1,
          "num_sanity_val_steps=" + std::to_string(options.num_sanity_val_steps()) + " must be >= -1");
  require(options.fast_dev_run() >= 0, "fast_dev_run=" + std::to_string(options.fast_dev_run()) + " must be >= 0");
  require(options.gradient_clip_algorithm() == "norm" || options.gradient_clip_algorithm() == "value",
          "gradient_clip_algorithm='" + options.gradient_clip_algorithm() + "' is not known; valid: \"norm\", \"value\"");
  require(!options.gradient_clip_val() || *options.gradient_clip_val() >= 0,
          "gradient_clip_val=" + std::to_string(options.gradient_clip_val().value_or(0)) + " must be >= 0");
  require(options.collective_timeout_ms() > 0,
          "collective_timeout_ms=" + std::to_string(options.collective_timeout_ms()) + " must be > 0");
  // Every environment variable fulgur honours, before anything reads one.
  runtime::validate_environment();
  require(options.num_nodes() >= 1, "num_nodes=" + std::to_string(options.num_nodes()) + " must be >= 1");
  // Check the limits now, before any process starts.
  for (auto [limit, name] : {std::pair{options.limit_train_batches(), "limit_train_batches"},
                             {options.limit_val_batches(), "limit_val_batches"},
                             {options.limit_test_batches(), "limit_test_batches"},
                             {options.limit_predict_batches(), "limit_predict_batches"},
                             {options.val_check_interval(), "val_check_interval"}}) {
    limit.resolve(1, name);
  }
}

// The strategy object given, else the one the options name. Throws std::invalid_argument for a
// null object or one that contradicts use_distributed_sampler.
std::shared_ptr<Strategy> resolve_strategy(const TrainerOptions& options) {
  const StrategyChoice& choice = options.strategy();
  if (choice.is_null()) {
    std::string names;
    for (const auto& n : strategy_names()) names += (names.empty() ? "" : ", ") + n;
    throw std::invalid_argument("strategy: the Strategy object (or name) given is null; give a configured strategy "
                                "object or one of the names " + names);
  }
  std::shared_ptr<Strategy> strategy = choice.object();
  if (!strategy) {
    strategy = make_strategy(StrategyRequest()
                                 .strategy(choice.name())
                                 .accelerator(options.accelerator())
                                 .devices(options.devices())
                                 .precision(options.precision())
                                 .num_nodes(options.num_nodes())
                                 .start_method(options.start_method())
                                 .max_restarts(options.max_restarts())
                                 .collective_timeout(std::chrono::milliseconds(options.collective_timeout_ms()))
                                 .use_distributed_sampler(options.use_distributed_sampler()));
  } else if (auto* parallel = dynamic_cast<ParallelStrategy*>(strategy.get());
             parallel && !options.use_distributed_sampler() && parallel->parallel_options().use_distributed_sampler()) {
    throw std::invalid_argument(
        "use_distributed_sampler=false, but the strategy object shards loaders (its "
        "ParallelOptions::use_distributed_sampler is true); with a strategy object, set it there");
  }
  return strategy;
}

// The callbacks given, with the default ModelCheckpoint, ProgressBar and ModelSummary where the
// options enable them and none is given; checked for nulls and shared state keys.
std::vector<std::shared_ptr<Callback>> resolve_callbacks(const TrainerOptions& options, bool dev_run) {
  std::vector<std::shared_ptr<Callback>> callbacks = options.callbacks();
  if (options.enable_checkpointing() && !dev_run && !find_callback<ModelCheckpoint>(callbacks)) {
    callbacks.push_back(std::make_shared<ModelCheckpoint>());
  }
  if (options.enable_progress_bar() && !find_callback<ProgressBar>(callbacks)) {
    callbacks.push_back(std::make_shared<ProgressBar>());
  }
  if (options.enable_model_summary() && !find_callback<ModelSummary>(callbacks)) {
    callbacks.insert(callbacks.begin(), std::make_shared<ModelSummary>());
  }
  require(options.accumulate_grad_batches() == 1 || !find_callback<GradientAccumulationScheduler>(callbacks),
          "accumulate_grad_batches=" + std::to_string(options.accumulate_grad_batches()) +
              " and a GradientAccumulationScheduler are both given; one decides the accumulation: keep "
              "accumulate_grad_batches at 1 with the scheduler (its {0, k} entry sets the first epochs'), or remove "
              "the scheduler");
  std::set<std::string> keys;
  for (const auto& c : callbacks) {
    require(c != nullptr, "callbacks: a callback is null");
    require(keys.insert(c->state_key()).second,
            "callbacks: two callbacks share the state key '" + c->state_key() + "'; give them different settings");
  }
  return callbacks;
}

// The loggers given, with TensorBoard's and a CSV logger when the option is `true`; none under
// fast_dev_run.
std::vector<std::shared_ptr<Logger>> resolve_loggers(const TrainerOptions& options, bool dev_run) {
  const LoggerChoice& logger = options.logger();
  for (size_t i = 0; i < logger.loggers().size(); ++i) {
    require(logger.loggers()[i] != nullptr,
            "logger: logger " + std::to_string(i) + " of the " + std::to_string(logger.loggers().size()) +
                " given is null; give a Logger object, true (a TensorBoardLogger and a CSVLogger in default_root_dir) or false (none)");
  }
  std::vector<std::shared_ptr<Logger>> loggers;
  if (!dev_run) {
    loggers = logger.loggers();
    // Lightning's default is TensorBoard when it is installed; the event-file writer here needs
    // nothing installed, so both are on: TensorBoard first (Trainer::logger(), as Lightning's),
    // and the CSV that fulgur-plot, spreadsheets and pandas read. They share one version_<N>.
    if (logger.default_logger()) {
      loggers.push_back(std::make_shared<TensorBoardLogger>(options.default_root_dir()));
      loggers.push_back(std::make_shared<CSVLogger>(options.default_root_dir()));
    }
  }
  return loggers;
}

}  // namespace

TrainerImpl::TrainerImpl(Trainer& owner_in, TrainerOptions opts) : owner(owner_in), options(std::move(opts)) {
  check_options(options);
  resolved.max_epochs = options.max_epochs().value_or(options.max_steps() == -1 ? 1000 : -1);
  if (options.fast_dev_run() > 0) {
    resolved.limit_overrides = options.fast_dev_run();
    resolved.max_epochs = 1;
  }
  if (options.gradient_clip_val() && *options.gradient_clip_val() > 0) resolved.gradient_clip_val = options.gradient_clip_val();

  strategy = resolve_strategy(options);
  const bool dev_run = resolved.limit_overrides > 0;
  callbacks = resolve_callbacks(options, dev_run);
  loggers = resolve_loggers(options, dev_run);
}

}  // namespace detail
}  // namespace fulgur

