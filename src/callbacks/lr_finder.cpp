// SPDX-License-Identifier: Apache-2.0
#include <fulgur/callbacks/callback.h>
#include <fulgur/callbacks/lr_finder.h>
#include <fulgur/checkpoint.h>
#include <fulgur/data_module.h>
#include <fulgur/launchers/launcher.h>
#include <fulgur/lightning_module.h>
#include <fulgur/optimizer_config.h>
#include <fulgur/strategies/strategy.h>

#include "runtime/log.h"
#include "trainer/run_context.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <stdexcept>

namespace fulgur {
namespace {

void check_options(const LRFinderOptions& o) {
  auto fail = [](const std::string& what) { throw std::invalid_argument("lr_find: " + what); };
  if (!(o.min_lr() > 0)) fail("min_lr=" + std::to_string(o.min_lr()) + " must be > 0");
  if (!(o.max_lr() > o.min_lr())) {
    fail("max_lr=" + std::to_string(o.max_lr()) + " must be greater than min_lr=" + std::to_string(o.min_lr()));
  }
  if (o.num_training() < 1) fail("num_training=" + std::to_string(o.num_training()) + " must be >= 1");
  if (o.mode() != "exponential" && o.mode() != "linear") {
    fail("mode '" + o.mode() + "' is not known; valid: \"exponential\", \"linear\"");
  }
  if (o.early_stop_threshold() && !(*o.early_stop_threshold() > 0)) {
    fail("early_stop_threshold=" + std::to_string(*o.early_stop_threshold()) + " must be > 0, or unset");
  }
  if (!(o.beta() >= 0 && o.beta() < 1)) fail("beta=" + std::to_string(o.beta()) + " is outside [0, 1)");
}

// Records the rate and the smoothed loss of every optimizer step, and sets the rate of the next.
class RangeTest : public Callback {
 public:
  explicit RangeTest(LRFinderOptions options) : options_(std::move(options)) {}
  std::string state_key() const override { return "LRFinder"; }

  // The rate of step i (zero-based), as Lightning's _ExponentialLR / _LinearLR give it: min_lr
  // at step 0, then r = (i + 1) / num_training of the way, so the last step takes max_lr.
  double lr_at(int64_t i) const {
    if (i == 0) return options_.min_lr();
    const double r = static_cast<double>(i + 1) / static_cast<double>(options_.num_training());
    if (options_.mode() == "linear") return options_.min_lr() + r * (options_.max_lr() - options_.min_lr());
    return options_.min_lr() * std::pow(options_.max_lr() / options_.min_lr(), r);
  }

  void on_train_start(Trainer& trainer, LightningModule&) override { set_lr(trainer, 0); }

  // Epoch-wise schedulers of the module step between epochs: the test's rate holds.
  void on_train_epoch_start(Trainer& trainer, LightningModule&) override {
    set_lr(trainer, static_cast<int64_t>(lrs.size()));
  }

  void on_train_batch_end(Trainer& trainer, LightningModule&, const StepOutput& out, const Batch&, int64_t) override {
    if (out.has_loss()) {
      window_sum_ += out.loss().detach().item<double>();
      ++window_count_;
    }
    if (trainer.global_step() == last_step_) return;  // a batch that only accumulated gradients
    last_step_ = trainer.global_step();
    double loss = window_count_ > 0 ? window_sum_ / static_cast<double>(window_count_) : std::nan("");
    // Several processes (LearningRateFinder under ddp or xla): the mean over the ranks, the same
    // number on each, so that every rank stops at the same step and suggests the same rate.
    if (trainer.world_size() > 1) {
      loss = trainer.strategy().reduce(torch::tensor({loss}, torch::kFloat64), "mean").item<double>();
    }
    window_sum_ = 0;
    window_count_ = 0;
    lrs.push_back(lr_at(static_cast<int64_t>(lrs.size())));
    // The bias-corrected moving average of the n losses so far: divided by 1 - beta^n, so the
    // first point is the first loss. (Lightning 2.x divides by 1 - beta^(global_step + 1), one
    // power more than its points, which shrinks its first points a little.)
    const double beta = options_.beta();
    const auto n = static_cast<double>(lrs.size());
    avg_loss_ = beta * avg_loss_ + (1 - beta) * loss;
    const double smoothed = avg_loss_ / (1 - std::pow(beta, n));
    if (options_.early_stop_threshold() && lrs.size() > 1 && smoothed > *options_.early_stop_threshold() * best_loss_) {
      trainer.set_should_stop(true);
    }
    if (lrs.size() == 1 || smoothed < best_loss_) best_loss_ = smoothed;
    losses.push_back(smoothed);
    // A per-step scheduler of the module stepped before this hook: the test's rate overrules it.
    set_lr(trainer, static_cast<int64_t>(lrs.size()));
  }

  std::vector<double> lrs;
  std::vector<double> losses;

 private:
  void set_lr(Trainer& trainer, int64_t step) {
    const double lr = lr_at(std::min(step, options_.num_training() - 1));
    for (const auto& opt : trainer.optimizer_config().optimizers)
      for (auto& group : opt->param_groups()) group.options().set_lr(lr);
  }

  LRFinderOptions options_;
  int64_t last_step_ = 0;
  double window_sum_ = 0;
  int64_t window_count_ = 0;
  double avg_loss_ = 0;
  double best_loss_ = 0;
};

// Rank 0 writes the curve to `csv_path` ("": <root_dir>/lr_find.csv); every rank records the path.
void write_curve(LRFinderResult& result, const std::string& csv_path, const std::string& root_dir, bool global_zero) {
  result.csv_path = csv_path.empty() ? root_dir + "/lr_find.csv" : csv_path;
  if (!global_zero) return;
  std::ofstream out(result.csv_path);
  if (!out) throw std::runtime_error("lr_find: cannot write the curve to " + result.csv_path);
  out << "step,lr,loss\n";
  char row[96];
  for (size_t i = 0; i < result.lrs.size(); ++i) {
    std::snprintf(row, sizeof(row), "%zu,%.17g,%.17g\n", i, result.lrs[i], result.losses[i]);
    out << row;
  }
  if (!out.flush()) throw std::runtime_error("lr_find: writing the curve to " + result.csv_path + " failed");
}

void report_early_stop(const LRFinderResult& result, int64_t num_training) {
  if (static_cast<int64_t>(result.lrs.size()) < num_training) {
    runtime::log_rank_zero(runtime::LogLevel::kInfo, "lr_find stopped early after " + std::to_string(result.lrs.size()) +
                                                         " steps: the loss diverged (or the loader ran out)");
  }
}

LRFinderResult run_range_test(const Trainer& trainer, LightningModule& model, LRFinderOptions options,
                              const std::function<void(Trainer&)>& fit) {
  check_options(options);
  LRFinderResult result;
  result.mode = options.mode();
  if (trainer.options().fast_dev_run() > 0) {
    runtime::warn_rank_zero_once("lr_find is skipped: fast_dev_run is on");
    return result;
  }
  auto test = std::make_shared<RangeTest>(options);
  TrainerOptions o = trainer.options();
  o.callbacks({test})
      .logger(false)
      .enable_checkpointing(false)
      .enable_progress_bar(false)
      .enable_model_summary(false)
      .max_steps(options.num_training())
      .max_epochs(-1)
      .num_sanity_val_steps(0)
      .limit_val_batches(0);
  Trainer inner(o);
  if (Launcher* launcher = inner.strategy().launcher(); launcher && launcher->creates_processes()) {
    throw std::invalid_argument(
        "lr_find runs the range test in this process, and this Trainer's strategy starts processes; run lr_find "
        "with a Trainer of one device (devices(1)) and give its suggestion to the multi-process run");
  }
  // The weights before the test (CPU copies), put back after it, also when it throws.
  const auto initial = state_dict(model);
  try {
    fit(inner);
  } catch (...) {
    load_state_dict(model, initial, true, "lr_find's saved weights");
    throw;
  }
  load_state_dict(model, initial, true, "lr_find's saved weights");
  result.lrs = test->lrs;
  result.losses = test->losses;
  report_early_stop(result, options.num_training());
  write_curve(result, options.csv_path(), trainer.options().default_root_dir(), inner.is_global_zero());
  return result;
}

}  // namespace

std::optional<int64_t> LRFinderResult::optimal_index(int64_t skip_begin, int64_t skip_end) const {
  if (skip_begin < 0 || skip_end < 0) {
    throw std::invalid_argument("LRFinderResult::suggestion: skip_begin=" + std::to_string(skip_begin) +
                                " and skip_end=" + std::to_string(skip_end) + " must both be >= 0");
  }
  const auto n = static_cast<int64_t>(losses.size());
  std::vector<double> x, y;
  std::vector<int64_t> index;
  for (int64_t i = skip_begin; i < n - skip_end; ++i) {
    if (!std::isfinite(losses[i])) continue;
    x.push_back(lrs[i]);
    y.push_back(losses[i]);
    index.push_back(i);
  }
  if (y.size() < 2) {
    runtime::warn_rank_zero_once(
        "lr_find: too few points for a suggestion (" + std::to_string(y.size()) +
        " finite ones after the skipped ones); raise num_training or give a larger loader");
    return std::nullopt;
  }
  const auto opts = torch::TensorOptions().dtype(torch::kFloat64);
  const at::Tensor losses_t = torch::tensor(y, opts);
  // Against log10(lr) in exponential mode, where the rates are spaced evenly in the log: Lightning
  // 2.x differentiates against the rate itself there (its issue #21141), which weighs the first,
  // densest points most and puts the suggestion at the start of the curve.
  at::Tensor lrs_t = torch::tensor(x, opts);
  if (mode != "linear") lrs_t = lrs_t.log10();
  const at::Tensor gradients = torch::gradient(losses_t, {lrs_t})[0];
  return index[gradients.argmin().item<int64_t>()];
}

std::optional<double> LRFinderResult::suggestion(int64_t skip_begin, int64_t skip_end) const {
  const auto i = optimal_index(skip_begin, skip_end);
  if (!i) return std::nullopt;
  return lrs[*i];
}

LRFinderResult lr_find(const Trainer& trainer, LightningModule& model, std::shared_ptr<BatchSource> train_loader,
                       LRFinderOptions options) {
  return run_range_test(trainer, model, std::move(options),
                        [&](Trainer& inner) { inner.fit(model, std::move(train_loader)); });
}

LRFinderResult lr_find(const Trainer& trainer, LightningModule& model, DataModule& datamodule, LRFinderOptions options) {
  return run_range_test(trainer, model, std::move(options), [&](Trainer& inner) { inner.fit(model, datamodule); });
}

LearningRateFinder::LearningRateFinder(LearningRateFinderOptions options, LearningRateSetter set_lr)
    : options_(std::move(options)), set_lr_(std::move(set_lr)) {
  try {
    check_options(test_options());
  } catch (const std::invalid_argument& e) {
    // check_options names num_training, which this callback calls num_training_steps.
    std::string what = e.what();
    if (const auto at = what.find("num_training="); at != std::string::npos) what.replace(at, 12, "num_training_steps");
    throw std::invalid_argument("LearningRateFinder: " + what.substr(what.find(' ') + 1));
  }
}

LRFinderOptions LearningRateFinder::test_options() const {
  return LRFinderOptions()
      .min_lr(options_.min_lr())
      .max_lr(options_.max_lr())
      .num_training(options_.num_training_steps())
      .mode(options_.mode())
      .early_stop_threshold(options_.early_stop_threshold())
      .csv_path(options_.csv_path());
}

void LearningRateFinder::on_fit_start(Trainer& trainer, LightningModule& model) {
  if (trainer.options().fast_dev_run() > 0) {
    runtime::warn_rank_zero_once("LearningRateFinder is skipped: fast_dev_run is on");
    return;
  }
  if (trainer.global_step() > 0) {
    // Resumed: the optimizers' restored state holds the rate; the module gets it back too.
    if (options_.update_attr() && optimal_lr_ && set_lr_) set_lr_(model, *optimal_lr_);
    return;
  }
  const LRFinderOptions options = test_options();
  RangeTest test(options);
  detail::RunContext& run = detail::run_context(trainer);
  run.run_probe(test, options.num_training());
  result_ = LRFinderResult();
  result_.mode = options.mode();
  result_.lrs = test.lrs;
  result_.losses = test.losses;
  report_early_stop(result_, options.num_training());
  write_curve(result_, options.csv_path(), trainer.options().default_root_dir(), trainer.is_global_zero());
  optimal_lr_ = result_.suggestion();
  if (!options_.update_attr() || !optimal_lr_) return;
  if (set_lr_) {
    set_lr_(model, *optimal_lr_);
    run.reconfigure_optimizers();
  } else {
    for (const auto& opt : trainer.optimizer_config().optimizers)
      for (auto& group : opt->param_groups()) group.options().set_lr(*optimal_lr_);
  }
  char rate[32];
  std::snprintf(rate, sizeof(rate), "%.6g", *optimal_lr_);
  runtime::log_rank_zero(runtime::LogLevel::kInfo, std::string("LearningRateFinder: learning rate set to ") + rate);
}

c10::IValue LearningRateFinder::state_dict() const {
  auto d = make_dict();
  if (optimal_lr_) d.insert("optimal_lr", *optimal_lr_);
  return d;
}

void LearningRateFinder::load_state_dict(const c10::IValue& state) {
  if (!state.isGenericDict()) return;
  const auto d = state.toGenericDict();
  if (d.contains("optimal_lr") && d.at("optimal_lr").isDouble()) optimal_lr_ = d.at("optimal_lr").toDouble();
}

}  // namespace fulgur
