#include <fulgur/callbacks/early_stopping.h>
#include <fulgur/callbacks/model_checkpoint.h>
#include <fulgur/callbacks/model_summary.h>
#include <fulgur/callbacks/progress_bar.h>
#include <fulgur/checkpoint.h>
#include <fulgur/data/device_loader.h>
#include <fulgur/loggers/csv_logger.h>
#include <fulgur/loggers/tensorboard_logger.h>
#include <fulgur/plugins/io/checkpoint_io.h>
#include <fulgur/strategies/ddp.h>
#include <fulgur/strategies/registry.h>
#include <fulgur/strategies/strategy.h>
#include <fulgur/trainer.h>

#include "runtime/log.h"
#include "runtime/memory.h"
#include "runtime/signals.h"
#include "optim/optim_state.h"
#include "trainer/trainer_impl.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <iostream>
#include <limits>
#include <stdexcept>

namespace fs = std::filesystem;

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

void seed_everything(uint64_t seed) {
  torch::manual_seed(seed);
  std::srand(static_cast<unsigned>(seed));
}

namespace detail {
namespace {

void require(bool ok, const std::string& message) {
  if (!ok) throw std::invalid_argument(message);
}

// "SIGTERM" for 15; the number for a signal without a name here.
std::string signal_name(int sig) {
  if (sig == SIGTERM) return "SIGTERM";
  if (sig == SIGINT) return "SIGINT";
  return "signal " + std::to_string(sig);
}

std::string format_metric(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.6g", v);
  return buf;
}

template <typename T>
T* find_callback(const std::vector<std::shared_ptr<Callback>>& callbacks) {
  for (const auto& c : callbacks)
    if (auto* p = dynamic_cast<T*>(c.get())) return p;
  return nullptr;
}

// checkpoint[path[0]][path[1]]...: state that fulgur's Trainer writes (the
// loop position, the generators). A checkpoint written elsewhere (Lightning
// keeps loops.fit_loop in another layout) may lack it; the error names the
// file, the whole key and what to do instead.
c10::IValue checkpoint_entry(const Checkpoint& checkpoint, const std::vector<std::string>& path,
                             const std::string& where, const c10::TypePtr& type = nullptr) {
  const std::string hint =
      "; fulgur's Trainer writes it (see docs/ARCHITECTURE.md, checkpoint format). To start from the weights of a "
      "checkpoint written elsewhere, load them with fulgur::load_from_checkpoint(model, path) and call fit without "
      "ckpt_path";
  c10::IValue v(checkpoint);
  std::string dotted;
  for (const auto& key : path) {
    if (!v.isGenericDict()) throw std::runtime_error(where + ": '" + dotted + "' is not a dict" + hint);
    dotted += (dotted.empty() ? "" : ".") + key;
    const auto dict = v.toGenericDict();
    const auto it = dict.find(key);
    if (it == dict.end()) throw std::runtime_error(where + ": missing key '" + dotted + "'" + hint);
    v = it->value();
  }
  if (type && !v.type()->isSubtypeOf(*type)) {
    throw std::runtime_error(where + ": '" + dotted + "' is a " + v.type()->str() + ", expected " + type->str() + hint);
  }
  return v;
}

int64_t batch_size_of(const Batch& batch) {
  return batch.data.defined() && batch.data.dim() > 0 ? batch.data.size(0) : 1;
}

}  // namespace

TrainerImpl::TrainerImpl(Trainer& owner_in, TrainerOptions opts) : owner(owner_in), options(std::move(opts)) {
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
  runtime::check_log_level();
  require(options.num_nodes() >= 1, "num_nodes=" + std::to_string(options.num_nodes()) + " must be >= 1");
  if (const char* nodes = std::getenv("NUM_NODES"); nodes && *nodes) {
    require(std::to_string(options.num_nodes()) == nodes,
            "num_nodes=" + std::to_string(options.num_nodes()) + " but the environment has NUM_NODES=" + nodes +
                "; pass the same node count to the Trainer (--num-nodes in the examples) or unset NUM_NODES");
  }
  // Check the limits now, before any process starts.
  for (auto [limit, name] : {std::pair{options.limit_train_batches(), "limit_train_batches"},
                             {options.limit_val_batches(), "limit_val_batches"},
                             {options.limit_test_batches(), "limit_test_batches"},
                             {options.limit_predict_batches(), "limit_predict_batches"},
                             {options.val_check_interval(), "val_check_interval"}}) {
    limit.resolve(1, name);
  }
  max_epochs = options.max_epochs().value_or(options.max_steps() == -1 ? 1000 : -1);

  if (options.fast_dev_run() > 0) {
    limit_overrides = options.fast_dev_run();
    max_epochs = 1;
  }

  strategy = options.strategy_object();
  if (!strategy) {
    StrategyRequest req;
    req.strategy = options.strategy();
    req.accelerator = options.accelerator();
    req.devices = options.devices();
    req.precision = options.precision();
    req.num_nodes = options.num_nodes();
    req.start_method = options.start_method();
    req.collective_timeout = std::chrono::milliseconds(options.collective_timeout_ms());
    req.use_distributed_sampler = options.use_distributed_sampler();
    strategy = make_strategy(req);
  } else if (auto* parallel = dynamic_cast<ParallelStrategy*>(strategy.get());
             parallel && !options.use_distributed_sampler() && parallel->parallel_options().use_distributed_sampler) {
    throw std::invalid_argument(
        "use_distributed_sampler=false, but the strategy_object shards loaders (its "
        "ParallelOptions::use_distributed_sampler is true); with a strategy object, set it there");
  }

  callbacks = options.callbacks();
  const bool dev_run = limit_overrides > 0;
  if (options.enable_checkpointing() && !dev_run && !find_callback<ModelCheckpoint>(callbacks)) {
    callbacks.push_back(std::make_shared<ModelCheckpoint>());
  }
  if (options.enable_progress_bar() && !find_callback<ProgressBar>(callbacks)) {
    callbacks.push_back(std::make_shared<ProgressBar>());
  }
  if (options.enable_model_summary() && !find_callback<ModelSummary>(callbacks)) {
    callbacks.insert(callbacks.begin(), std::make_shared<ModelSummary>());
  }
  std::set<std::string> keys;
  for (const auto& c : callbacks) {
    require(c != nullptr, "callbacks: a callback is null");
    require(keys.insert(c->state_key()).second,
            "callbacks: two callbacks share the state key '" + c->state_key() + "'; give them different settings");
  }
  require(!options.logger_object() || options.loggers().empty(),
          "logger_object and loggers are both set; put the logger_object into loggers (the first one's log_dir holds "
          "the checkpoints)");
  for (const auto& l : options.loggers()) require(l != nullptr, "loggers: a logger is null");
  if (options.logger() && !dev_run) {
    loggers = options.loggers();
    if (options.logger_object()) loggers.push_back(options.logger_object());
    if (loggers.empty()) loggers.push_back(std::make_shared<CSVLogger>(options.default_root_dir()));
  }
}

void TrainerImpl::materialize_metrics() const {
  for (const auto& [k, v] : pending_callback_metrics) callback_metrics[k] = v.item<double>();
  pending_callback_metrics.clear();
}

void TrainerImpl::log(const std::string& name, const at::Tensor& value, const LogOptions& opts) {
  if (!model) throw std::logic_error("log('" + name + "') was called outside a Trainer run");
  if (opts.rank_zero_only && opts.sync_dist) {
    throw std::invalid_argument("log('" + name + "'): rank_zero_only=true with sync_dist=true: the reduction is a "
                                "collective that the other ranks would never join; drop one of the two");
  }
  if (opts.rank_zero_only && !strategy->is_global_zero()) return;
  results.log(name, value, opts, in_training_step, current_batch_size, reducer());
}

ResultCollection::Reducer TrainerImpl::reducer() {
  return [this](const at::Tensor& t, const std::string& op) { return strategy->reduce(t, op); };
}

void TrainerImpl::log_step_metrics(bool force) {
  std::map<std::string, ResultCollection::Logged> for_logger;
  for (auto& [k, v] : results.take_step_values()) {
    if (v.prog_bar) pending_prog_bar[k] = v.value;
    if (!v.logger) continue;
    pending_callback_metrics[k] = v.value;
    for_logger.emplace(k, v);
  }
  const bool due = global_step % options.log_every_n_steps() == 0 || force;
  if (loggers.empty() || !strategy->is_global_zero() || for_logger.empty() || !due || global_step == last_logged_step) {
    return;
  }
  last_logged_step = global_step;
  auto row = to_doubles(for_logger);
  row["epoch"] = static_cast<double>(current_epoch);
  for (auto& l : loggers) l->log_metrics(row, global_step);
}

void TrainerImpl::log_epoch_metrics(const std::map<std::string, ResultCollection::Logged>& values,
                                    const Metrics& read, int64_t step) {
  std::map<std::string, double> row;
  for (const auto& [k, ev] : values) {
    const double v = read.at(k);
    callback_metrics[k] = v;
    if (ev.prog_bar) progress_bar_metrics[k] = v;
    if (ev.logger) row[k] = v;
  }
  if (strategy->is_global_zero() && !row.empty()) {
    row["epoch"] = static_cast<double>(current_epoch);
    for (auto& l : loggers) l->log_metrics(row, step);
  }
}

void TrainerImpl::clip_gradients(torch::optim::Optimizer& optimizer) {
  if (!options.gradient_clip_val() || *options.gradient_clip_val() <= 0) return;
  const double clip = *options.gradient_clip_val();
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
  auto coef = (clip / (total + 1e-6)).clamp_max(1.0);
  for (auto& g : grads) g.mul_(coef.to(g.scalar_type()));
}

void TrainerImpl::step_schedulers(const std::string& interval) {
  const auto& cfg = strategy->optimizer_config();
  for (size_t i = 0; i < cfg.schedulers.size(); ++i) {
    const auto& s = cfg.schedulers[i];
    if (s.interval != interval) continue;
    const int64_t unit = interval == "step" ? global_step : current_epoch + 1;
    if (unit % std::max<int64_t>(1, s.frequency) != 0) continue;
    s.scheduler->step();
    ++scheduler_counts[i];
  }
}

void TrainerImpl::optimizer_step_automatic(const Batch& batch, int64_t batch_idx, StepOutput& out, bool sync_now) {
  const auto& cfg = strategy->optimizer_config();
  auto& optimizer = *cfg.optimizers.at(0);
  const double k = static_cast<double>(options.accumulate_grad_batches());
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
  optimizer.zero_grad();
  ++global_step;
  step_schedulers("step");
}

void TrainerImpl::training_batch(const Batch& batch, int64_t batch_idx) {
  current_batch_size = batch_size_of(batch);
  strategy->on_train_batch_start(batch, batch_idx);
  model->on_train_batch_start(batch, batch_idx);
  StepOutput out;
  if (model->automatic_optimization()) {
    ++accumulated;
    const bool sync_now = accumulated >= options.accumulate_grad_batches() || batch_idx + 1 == num_training_batches;
    optimizer_step_automatic(batch, batch_idx, out, sync_now);
    if (sync_now) accumulated = 0;
  } else {
    in_training_step = true;
    out = strategy->training_step(batch, batch_idx);
    in_training_step = false;
  }
  log_step_metrics(false);
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
    // EarlyStopping) acts on a partial evaluation.
    if (was_training) model->train();
    results = std::move(saved);
    return {};
  }
  if (is_val) {
    model->on_validation_epoch_end();
  } else {
    model->on_test_epoch_end();
  }
  auto values = results.epoch_values(reducer());
  const Metrics metrics = to_doubles(values);
  if (!sanity_checking) log_epoch_metrics(values, metrics, global_step);
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
  num_training_batches = limit_overrides > 0 ? std::min(limit_overrides, available)
                                             : options.limit_train_batches().resolve(available, "limit_train_batches");
  int64_t val_batches = 0;
  if (val_source) {
    val_batches = limit_overrides > 0 ? std::min(limit_overrides, val_source->num_batches())
                                      : options.limit_val_batches().resolve(val_source->num_batches(), "limit_val_batches");
  }
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

  for (auto& c : callbacks) c->on_fit_start(owner, *model);
  model->on_fit_start();

  if (val_source && val_batches > 0 && global_step == 0 && limit_overrides == 0) {
    const int64_t n = options.num_sanity_val_steps() == -1 ? val_batches : std::min(options.num_sanity_val_steps(), val_batches);
    if (n > 0) {
      sanity_checking = true;
      evaluation_loop(Stage::kSanityCheck, *val_source, n);
      sanity_checking = false;
    }
  }

  auto done = [&] {
    if (options.max_steps() != -1 && global_step >= options.max_steps()) return true;
    if (max_epochs != -1 && current_epoch >= max_epochs) return true;
    return should_stop && current_epoch >= options.min_epochs();
  };

  while (!done()) {
    if (num_training_batches == 0) break;
    train_source->set_epoch(current_epoch);
    if (val_source) val_source->set_epoch(current_epoch);
    model->train();
    results.reset();
    epoch_finished = false;
    for (auto& c : callbacks) c->on_train_epoch_start(owner, *model);
    model->on_train_epoch_start();
    bool interrupted = stop_agreed;  // during the sanity check
    if (!interrupted) {
      auto stream = train_source->open(epoch_batches_done);
      for (int64_t batch_idx = epoch_batches_done; batch_idx < num_training_batches; ++batch_idx) {
        auto batch = stream->next();
        if (!batch) break;
        training_batch(*batch, batch_idx);
        epoch_batches_done = batch_idx + 1;
        const bool last = batch_idx + 1 == num_training_batches;
        const bool check_val = val_source && val_batches > 0 &&
                               (current_epoch + 1) % options.check_val_every_n_epoch() == 0 &&
                               ((batch_idx + 1) % val_every == 0 || (last && vci.is_fraction()));
        if (last) epoch_finished = true;
        if (check_val) evaluation_loop(Stage::kValidate, *val_source, val_batches);
        if (stop_agreed || stop_requested(train_poll, last)) {
          interrupted = true;
          break;
        }
        if (options.max_steps() != -1 && global_step >= options.max_steps()) break;
        if (should_stop && current_epoch >= options.min_epochs()) break;
      }
    }
    if (interrupted) {
      const int sig = runtime::received_stop_signal();
      std::string path = owner.log_dir() + "/checkpoints/last.ckpt";
      if (auto* mc = owner.checkpoint_callback(); mc && !mc->dirpath().empty()) path = mc->dirpath() + "/last.ckpt";
      owner.save_checkpoint(path);
      runtime::log_rank_zero(runtime::LogLevel::kWarning, "stopping at step " + std::to_string(global_step) +
                                                              " on signal " + std::to_string(sig ? sig : SIGTERM) +
                                                              "; checkpoint saved to " + path);
      if (strategy->is_global_zero())
        for (auto& l : loggers) l->finalize("interrupted");
      report_fit_end("signal " + std::to_string(sig ? sig : SIGTERM) + " (" + signal_name(sig ? sig : SIGTERM) +
                     "); last checkpoint " + path);
      throw WorkerFailure("interrupted by signal " + std::to_string(sig ? sig : SIGTERM) + " at step " +
                              std::to_string(global_step) + "; checkpoint saved to " + path,
                          static_cast<int>(strategy->global_rank()), 128 + (sig ? sig : SIGTERM));
    }
    // Epoch end: aggregates, hooks, then the next epoch.
    auto values = results.epoch_values(reducer());
    log_epoch_metrics(values, to_doubles(values), global_step);
    model->on_train_epoch_end();
    for (auto& c : callbacks) c->on_train_epoch_end(owner, *model);
    log_step_metrics(true);
    step_schedulers("epoch");
    if (!epoch_finished) break;  // stopped mid-epoch (max_steps or should_stop)
    ++current_epoch;
    epoch_batches_done = 0;
  }
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
  if (options.max_steps() != -1 && global_step >= options.max_steps()) {
    return "max_steps=" + std::to_string(options.max_steps()) + " reached";
  }
  if (should_stop) {
    if (auto* es = find_callback<EarlyStopping>(callbacks); es && es->stopped_epoch() == current_epoch - (epoch_finished ? 1 : 0)) {
      const std::string& monitor = es->options().monitor();
      std::string why = "EarlyStopping on " + monitor;
      if (auto it = callback_metrics.find(monitor); it != callback_metrics.end()) why += "=" + format_metric(it->second);
      return why + (es->reason().empty() ? " (the decision of another rank)" : " (" + es->reason() + ")");
    }
    return "should_stop was set";
  }
  if (max_epochs != -1 && current_epoch >= max_epochs) return "max_epochs=" + std::to_string(max_epochs) + " reached";
  return "the training loader ran out";
}

void TrainerImpl::report_fit_end(const std::string& why) const {
  if (!strategy->is_global_zero()) return;
  using runtime::LogLevel;
  runtime::log_rank_zero(LogLevel::kInfo, "fit stopped at epoch " + std::to_string(current_epoch) + ", step " +
                                              std::to_string(global_step) + ": " + why);
  if (auto* mc = owner.checkpoint_callback()) {
    if (!mc->best_model_path().empty()) {
      const std::string& monitor = mc->options().monitor();
      std::string score = monitor.empty() || !mc->best_model_score()
                              ? "the most recent; no monitor"
                              : monitor + "=" + format_metric(*mc->best_model_score());
      runtime::log_rank_zero(LogLevel::kInfo, "best checkpoint: " + mc->best_model_path() + " (" + score + ")");
    } else if (!mc->last_model_path().empty()) {
      runtime::log_rank_zero(LogLevel::kInfo, "last checkpoint: " + mc->last_model_path());
    } else {
      runtime::log_rank_zero(LogLevel::kInfo, "no checkpoint was saved");
    }
  } else {
    runtime::log_rank_zero(LogLevel::kInfo, "no checkpoints (enable_checkpointing is off)");
  }
  std::string dirs;
  for (const auto& l : loggers) dirs += (dirs.empty() ? "" : ", ") + l->log_dir();
  runtime::log_rank_zero(LogLevel::kInfo, loggers.empty() ? "no logs (logger is off)" : "logs: " + dirs);
}

Checkpoint TrainerImpl::dump_checkpoint() {
  Checkpoint ckpt = make_dict();
  ckpt.insert("epoch", current_epoch);
  ckpt.insert("global_step", global_step);
  ckpt.insert("pytorch-lightning_version", std::string("2.1.0"));
  ckpt.insert("fulgur_format_version", static_cast<int64_t>(1));
  ckpt.insert("state_dict", state_dict(*model));
  c10::impl::GenericList opt_states(c10::AnyType::get());
  for (auto& opt : strategy->optimizer_config().optimizers) opt_states.push_back(optimizer_state_dict(*opt));
  ckpt.insert("optimizer_states", opt_states);
  c10::impl::GenericList sched_states(c10::AnyType::get());
  for (size_t i = 0; i < strategy->optimizer_config().schedulers.size(); ++i) {
    auto s = fulgur::make_dict();
    s.insert("_step_count", scheduler_counts.at(i) + 1);
    s.insert("last_epoch", scheduler_counts.at(i));
    sched_states.push_back(s);
  }
  ckpt.insert("lr_schedulers", sched_states);
  ckpt.insert("callbacks", callback_states());
  auto loop = fulgur::make_dict();
  loop.insert("epoch", current_epoch);
  loop.insert("batches_done", epoch_batches_done);
  loop.insert("epoch_finished", epoch_finished);
  loop.insert("global_step", global_step);
  loop.insert("world_size", strategy->world_size());
  auto loops = fulgur::make_dict();
  loops.insert("fit_loop", loop);
  ckpt.insert("loops", loops);
  // Every rank's generator state, so each rank resumes its own random stream.
  auto rng = at::detail::getDefaultCPUGenerator().get_state();
  auto rng_states = fulgur::make_dict();
  at::Tensor gathered = strategy->all_gather(rng).to(torch::kCPU);
  if (gathered.dim() == 1) gathered = gathered.unsqueeze(0);  // one process: no gather happened
  rng_states.insert("torch", gathered);
  ckpt.insert("rng_states", rng_states);
  ckpt.insert("hyper_parameters", model->hparams());
  model->on_save_checkpoint(ckpt);
  for (auto& c : callbacks) c->on_save_checkpoint(owner, *model, ckpt);
  return ckpt;
}

namespace {

// Larger loop counts than any run reaches (2^53: still exact as the float
// scores that ModelCheckpoint keeps).
constexpr int64_t kMaxLoopCount = int64_t(1) << 53;
// libtorch's LRScheduler counts its steps in an unsigned int.
constexpr int64_t kMaxSchedulerCount = std::numeric_limits<unsigned>::max();

// The int under `key` of `d`, in [0, bound]; the error names the file, the
// key (`name`), the value and the bound, with `why` the bound is what it is.
int64_t check_count(int64_t n, const std::string& where, const std::string& name, int64_t bound, const std::string& why) {
  if (n < 0 || n > bound) {
    throw std::runtime_error(where + ": '" + name + "' is " + std::to_string(n) + ", outside [0, " + std::to_string(bound) +
                             "] (" + why + "); the checkpoint is corrupt or was made for another run");
  }
  return n;
}

int64_t read_count(const c10::Dict<std::string, c10::IValue>& d, const std::string& key, const std::string& where,
                   const std::string& name, int64_t bound, const std::string& why) {
  if (!d.contains(key)) throw std::runtime_error(where + ": missing key '" + name + "'");
  const c10::IValue v = d.at(key);
  if (!v.isInt()) throw std::runtime_error(where + ": '" + name + "' is " + v.tagKind() + ", expected an int");
  return check_count(v.toInt(), where, name, bound, why);
}

// libtorch's LRScheduler has no setter for its step count, which it keeps
// protected; a member pointer formed through a subclass reaches it.
struct SchedulerStepCount : torch::optim::LRScheduler {
  static void set(torch::optim::LRScheduler& s, unsigned n) { s.*(&SchedulerStepCount::step_count_) = n; }
};

// Puts `scheduler` where `n` calls of step() would, without making them. For
// libtorch's schedulers (StepLR) the count is all the state there is: the
// next rate comes from the optimizer's current one, which the optimizer's
// state restores. A scheduler of the user's with state of its own beyond
// the count is not replayed either.
void set_scheduler_step_count(torch::optim::LRScheduler& scheduler, int64_t n) {
  SchedulerStepCount::set(scheduler, static_cast<unsigned>(n));
}

}  // namespace

c10::Dict<std::string, c10::IValue> TrainerImpl::callback_states() const {
  auto states = fulgur::make_dict();
  for (const auto& c : callbacks) {
    auto s = c->state_dict();
    if (!s.isNone()) states.insert(c->state_key(), s);
  }
  return states;
}

void TrainerImpl::load_callback_states(const c10::IValue& states) {
  const auto d = c10::impl::toTypedDict<std::string, c10::IValue>(states.toGenericDict());
  for (auto& c : callbacks)
    if (d.contains(c->state_key())) c->load_state_dict(d.at(c->state_key()));
}

void TrainerImpl::restore(const std::string& path) {
  Checkpoint ckpt = strategy->load_checkpoint(path);
  const std::string where = "checkpoint " + path;
  auto get = [&](const char* key) -> c10::IValue {
    if (!ckpt.contains(key)) throw std::runtime_error(where + ": missing key '" + key + "'");
    return ckpt.at(key);
  };
  auto sd = get("state_dict");
  if (!sd.isGenericDict()) throw std::runtime_error(where + ": 'state_dict' is not a dict");
  load_state_dict(*model, c10::impl::toTypedDict<std::string, c10::IValue>(sd.toGenericDict()), true, where);
  if (stage != Stage::kFit) return;
  // The loop and generator state first: a checkpoint without it is refused before anything is restored.
  auto loop_int = [&](const char* key) {
    return checkpoint_entry(ckpt, {"loops", "fit_loop", key}, where, c10::IntType::get()).toInt();
  };
  const int64_t epoch = loop_int("epoch");
  const int64_t step = loop_int("global_step");
  const int64_t batches_done = loop_int("batches_done");
  const bool epoch_finished =
      checkpoint_entry(ckpt, {"loops", "fit_loop", "epoch_finished"}, where, c10::BoolType::get()).toBool();
  const at::Tensor rng_states = ckpt.contains("rng_states")
                                    ? checkpoint_entry(ckpt, {"rng_states", "torch"}, where, c10::TensorType::get()).toTensor()
                                    : at::Tensor();
  auto opts = get("optimizer_states").toList();
  const auto& cfg = strategy->optimizer_config();
  if (opts.size() != cfg.optimizers.size()) {
    throw std::runtime_error(where + ": has " + std::to_string(opts.size()) + " optimizer states, the model configures " +
                             std::to_string(cfg.optimizers.size()) + " optimizers");
  }
  // Every count is checked against what this run allows before it is used.
  current_epoch = check_count(epoch, where, "loops.fit_loop.epoch", kMaxLoopCount, "no run gets that far");
  global_step = check_count(step, where, "loops.fit_loop.global_step", kMaxLoopCount, "no run gets that far");
  epoch_batches_done = check_count(batches_done, where, "loops.fit_loop.batches_done", train_source->num_batches(),
                                   "the batches of one epoch of this run's training loader");
  if (epoch_finished) {
    ++current_epoch;
    epoch_batches_done = 0;
  }
  // A scheduler takes its saved count directly (no replay, whatever the
  // count); its learning rate comes back with the optimizer's state below.
  auto scheds = get("lr_schedulers").toList();
  for (size_t i = 0; i < cfg.schedulers.size() && i < scheds.size(); ++i) {
    if (!scheds.get(i).isGenericDict()) throw std::runtime_error(where + ": lr_schedulers[" + std::to_string(i) + "] is not a dict");
    auto s = c10::impl::toTypedDict<std::string, c10::IValue>(scheds.get(i).toGenericDict());
    const SchedulerConfig& sc = cfg.schedulers[i];
    const bool per_step = sc.interval == "step";
    const int64_t bound = std::min<int64_t>(per_step ? global_step : current_epoch + 1, kMaxSchedulerCount);
    const int64_t n = read_count(s, "last_epoch", where, "lr_schedulers[" + std::to_string(i) + "].last_epoch", bound,
                                 per_step ? "a scheduler stepped per optimizer step, and the checkpoint's global_step is " +
                                                std::to_string(global_step)
                                          : "a scheduler stepped per epoch, and the checkpoint is in epoch " +
                                                std::to_string(current_epoch));
    set_scheduler_step_count(*sc.scheduler, n);
    scheduler_counts[i] = n;
  }
  for (size_t i = 0; i < opts.size(); ++i) {
    load_optimizer_state_dict(*cfg.optimizers[i], opts.get(i), where + ", optimizer " + std::to_string(i));
    optimizer_state_to_params_device(*cfg.optimizers[i]);
  }
  const c10::IValue cbs = get("callbacks");
  if (!cbs.isGenericDict()) throw std::runtime_error(where + ": 'callbacks' is not a dict");
  load_callback_states(cbs);
  if (rng_states.defined() && rng_states.dim() == 2 && rng_states.size(0) == strategy->world_size()) {
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    gen.set_state(rng_states[strategy->global_rank()].contiguous());
  }
  model->on_load_checkpoint(ckpt);
}

std::string TrainerImpl::resolve_ckpt_path(const std::string& ckpt_path) const {
  if (ckpt_path.empty()) return "";
  auto* mc = owner.checkpoint_callback();
  if (ckpt_path == "best") {
    if (!mc || mc->best_model_path().empty()) {
      throw std::invalid_argument("ckpt_path=\"best\": no best checkpoint is known (no ModelCheckpoint saved one in this Trainer)");
    }
    return mc->best_model_path();
  }
  if (ckpt_path != "last") return ckpt_path;
  // "last": last.ckpt of the checkpoint folder, else the newest last.ckpt under the log root.
  std::vector<fs::path> candidates;
  std::error_code ec;
  if (mc && !mc->options().dirpath().empty()) candidates.push_back(fs::path(mc->options().dirpath()) / "last.ckpt");
  const fs::path root = fs::path(options.default_root_dir()) / "lightning_logs";
  if (fs::is_directory(root, ec)) {
    for (const auto& v : fs::directory_iterator(root, ec)) candidates.push_back(v.path() / "checkpoints" / "last.ckpt");
  }
  candidates.push_back(fs::path(options.default_root_dir()) / "checkpoints" / "last.ckpt");
  fs::path best;
  fs::file_time_type best_time;
  for (const auto& c : candidates) {
    if (!fs::is_regular_file(c, ec)) continue;
    auto t = fs::last_write_time(c, ec);
    if (best.empty() || t > best_time) {
      best = c;
      best_time = t;
    }
  }
  if (best.empty()) {
    runtime::log_rank_zero(runtime::LogLevel::kWarning, "warning: ckpt_path=\"last\" but no last.ckpt was found under " +
                                                            options.default_root_dir() + "; starting from scratch");
    return "";
  }
  return best.string();
}

c10::IValue TrainerImpl::make_result(const std::vector<at::Tensor>& preds) {
  auto r = fulgur::make_dict();
  r.insert("state_dict", state_dict(*model));
  materialize_metrics();
  c10::Dict<std::string, double> cm;
  for (const auto& [k, v] : callback_metrics) cm.insert(k, v);
  r.insert("callback_metrics", cm);
  r.insert("current_epoch", current_epoch);
  r.insert("global_step", global_step);
  r.insert("callbacks", callback_states());
  if (strategy->is_global_zero()) {
    c10::List<std::string> versions;
    for (const auto& l : loggers) versions.push_back(l->version());
    r.insert("logger_versions", versions);
  }
  c10::List<at::Tensor> p;
  for (const auto& t : preds) p.push_back(t);
  r.insert("predictions", p);
  Launcher* launcher = strategy->launcher();
  if (stage == Stage::kFit && launcher && launcher->creates_processes()) {
    Checkpoint c = dump_checkpoint();  // collective: every rank dumps
    // Only rank 0's result reaches the launching process.
    if (strategy->is_global_zero()) r.insert("checkpoint", to_cpu(c10::IValue(c)));
  }
  return r;
}

void TrainerImpl::apply_result(const c10::IValue& value) {
  if (!value.isGenericDict()) return;
  auto r = c10::impl::toTypedDict<std::string, c10::IValue>(value.toGenericDict());
  load_state_dict(*model, c10::impl::toTypedDict<std::string, c10::IValue>(r.at("state_dict").toGenericDict()), true,
                  "result of rank 0");
  callback_metrics.clear();
  for (const auto& kv : r.at("callback_metrics").toGenericDict()) {
    callback_metrics[kv.key().toStringRef()] = kv.value().toDouble();
  }
  current_epoch = r.at("current_epoch").toInt();
  global_step = r.at("global_step").toInt();
  load_callback_states(r.at("callbacks"));
  predictions.clear();
  for (const auto& t : r.at("predictions").toTensorList()) predictions.push_back(t);
  if (r.contains("checkpoint")) {
    final_checkpoint = c10::impl::toTypedDict<std::string, c10::IValue>(r.at("checkpoint").toGenericDict());
  }
  if (r.contains("logger_versions")) {
    const auto versions = r.at("logger_versions").toList();
    for (size_t i = 0; i < loggers.size() && i < versions.size(); ++i) {
      const int64_t v = std::stoll(versions.get(i).toStringRef());
      if (auto* csv = dynamic_cast<CSVLogger*>(loggers[i].get())) csv->set_version(v);
      if (auto* tb = dynamic_cast<TensorBoardLogger*>(loggers[i].get())) tb->set_version(v);
    }
  }
}

c10::IValue TrainerImpl::run_in_worker(Stage run_stage, LightningModule& m, StageData data, const std::string& ckpt_path) {
  stage = run_stage;
  model = &m;
  m.attach_trainer(&owner);
  struct Detach {
    TrainerImpl* self;
    ~Detach() {
      self->model->attach_trainer(nullptr);
      self->train_source.reset();
      self->val_source.reset();
    }
  } detach{this};
  // Installed once the rendezvous and the restore are done, as Lightning
  // registers its handlers: until then SIGTERM and SIGINT keep their default
  // action and end the worker at once, wherever it waits.
  std::optional<runtime::StopSignalGuard> signals;
  train_poll.reset();
  eval_poll.reset();
  stop_agreed = false;
  runtime::apply_malloc_policy();

  strategy->setup_environment();
  struct Teardown {
    Strategy* s;
    ~Teardown() { s->teardown(); }
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
  // Every version before any logger writes: loggers on one root_dir and name share version_<N>.
  if (strategy->is_global_zero())
    for (auto& l : loggers) l->version();
  scheduler_counts.assign(strategy->optimizer_config().schedulers.size(), 0);
  results.reset();
  pending_callback_metrics.clear();
  callback_metrics.clear();
  progress_bar_metrics.clear();
  should_stop = false;

  predictions.clear();
  predict_batch_indices.clear();
  const std::string path = resolve_ckpt_path(ckpt_path);
  if (run_stage == Stage::kFit) {
    if (!data.train) throw std::invalid_argument("fit: no training loader (pass one, or give the DataModule a train_dataloader)");
    train_source = strategy->process_dataloader(data.train);
    val_source = data.val ? strategy->process_dataloader(data.val) : nullptr;
    current_epoch = 0;
    global_step = 0;
    epoch_batches_done = 0;
    accumulated = 0;
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
      train_poll.emplace(agree, kStopAgreeEvery);
      eval_poll.emplace(agree, kStopAgreeEvery);
    }
    if (strategy->is_global_zero())
      for (auto& l : loggers) l->log_hyperparams(model->hparams());
    fit_loop();
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
    const int64_t n = limit_overrides > 0 ? std::min(limit_overrides, source->num_batches())
                                          : limit.resolve(source->num_batches(), "limit_*_batches");
    if (run_stage == Stage::kPredict) {
      predict_loop(*source, n);
    } else {
      auto metrics = evaluation_loop(run_stage, *source, n);
      for (const auto& [k, v] : metrics) callback_metrics[k] = v;
      if (strategy->is_global_zero())
        for (auto& l : loggers) l->save();
    }
  }
  return make_result(predictions);
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

}  // namespace detail

// --- Trainer ---------------------------------------------------------------

TrainerOptions& TrainerOptions::devices(const std::vector<int64_t>& indices) {
  std::string spec;
  for (int64_t i : indices) spec += std::to_string(i) + ",";
  if (indices.size() > 1) spec.pop_back();
  devices_ = indices.empty() ? "," : spec;
  return *this;
}

Trainer::Trainer(TrainerOptions options) : impl_(std::make_unique<detail::TrainerImpl>(*this, std::move(options))) {}
Trainer::~Trainer() = default;

void Trainer::fit(LightningModule& model, DataModule& datamodule, const std::string& ckpt_path) {
  detail::StageData d;
  d.datamodule = &datamodule;
  impl_->run(Stage::kFit, model, d, ckpt_path);
}

void Trainer::fit(LightningModule& model, std::shared_ptr<BatchSource> train_loader,
                  std::shared_ptr<BatchSource> val_loader, const std::string& ckpt_path) {
  detail::StageData d;
  d.train = std::move(train_loader);
  d.val = std::move(val_loader);
  impl_->run(Stage::kFit, model, d, ckpt_path);
}

Metrics Trainer::validate(LightningModule& model, DataModule& datamodule, const std::string& ckpt_path) {
  detail::StageData d;
  d.datamodule = &datamodule;
  impl_->run(Stage::kValidate, model, d, ckpt_path);
  return callback_metrics();
}

Metrics Trainer::validate(LightningModule& model, std::shared_ptr<BatchSource> loader, const std::string& ckpt_path) {
  detail::StageData d;
  d.eval = std::move(loader);
  impl_->run(Stage::kValidate, model, d, ckpt_path);
  return callback_metrics();
}

Metrics Trainer::test(LightningModule& model, DataModule& datamodule, const std::string& ckpt_path) {
  detail::StageData d;
  d.datamodule = &datamodule;
  impl_->run(Stage::kTest, model, d, ckpt_path);
  return callback_metrics();
}

Metrics Trainer::test(LightningModule& model, std::shared_ptr<BatchSource> loader, const std::string& ckpt_path) {
  detail::StageData d;
  d.eval = std::move(loader);
  impl_->run(Stage::kTest, model, d, ckpt_path);
  return callback_metrics();
}

std::vector<at::Tensor> Trainer::predict(LightningModule& model, DataModule& datamodule, const std::string& ckpt_path) {
  detail::StageData d;
  d.datamodule = &datamodule;
  impl_->run(Stage::kPredict, model, d, ckpt_path);
  return impl_->predictions;
}

std::vector<at::Tensor> Trainer::predict(LightningModule& model, std::shared_ptr<BatchSource> loader,
                                         const std::string& ckpt_path) {
  detail::StageData d;
  d.eval = std::move(loader);
  impl_->run(Stage::kPredict, model, d, ckpt_path);
  return impl_->predictions;
}

const TrainerOptions& Trainer::options() const { return impl_->options; }
Strategy& Trainer::strategy() const { return *impl_->strategy; }
int64_t Trainer::current_epoch() const { return impl_->current_epoch; }
int64_t Trainer::global_step() const { return impl_->global_step; }
bool Trainer::should_stop() const { return impl_->should_stop; }
void Trainer::set_should_stop(bool value) { impl_->should_stop = value; }
bool Trainer::sanity_checking() const { return impl_->sanity_checking; }
bool Trainer::is_global_zero() const { return impl_->strategy->is_global_zero(); }
int64_t Trainer::world_size() const { return impl_->strategy->world_size(); }
int64_t Trainer::global_rank() const { return impl_->strategy->global_rank(); }
int64_t Trainer::num_training_batches() const { return impl_->num_training_batches; }
int64_t Trainer::max_epochs() const { return impl_->max_epochs; }
int64_t Trainer::max_steps() const { return impl_->options.max_steps(); }

const Metrics& Trainer::callback_metrics() const {
  impl_->materialize_metrics();
  return impl_->callback_metrics;
}

const Metrics& Trainer::progress_bar_metrics() const {
  for (const auto& [k, v] : impl_->pending_prog_bar) impl_->progress_bar_metrics[k] = v.item<double>();
  impl_->pending_prog_bar.clear();
  return impl_->progress_bar_metrics;
}

const std::shared_ptr<Logger>& Trainer::logger() const {
  static const std::shared_ptr<Logger> none;
  return impl_->loggers.empty() ? none : impl_->loggers.front();
}

const std::vector<std::shared_ptr<Logger>>& Trainer::loggers() const { return impl_->loggers; }

std::string Trainer::log_dir() const {
  if (!impl_->loggers.empty()) return impl_->loggers.front()->log_dir();
  return impl_->options.default_root_dir();
}

const std::vector<std::shared_ptr<Callback>>& Trainer::callbacks() const { return impl_->callbacks; }

ModelCheckpoint* Trainer::checkpoint_callback() const { return detail::find_callback<ModelCheckpoint>(impl_->callbacks); }

const OptimizerConfig& Trainer::optimizer_config() const { return impl_->strategy->optimizer_config(); }

Checkpoint Trainer::dump_checkpoint() {
  if (impl_->final_checkpoint && !is_fulgur_worker()) {
    // After a multi-process fit, in the launching process: rank 0's state at
    // the end of fit, with the weights of the model as they are now.
    Checkpoint c = impl_->final_checkpoint->copy();
    c.insert_or_assign("state_dict", state_dict(*impl_->model));
    return c;
  }
  return impl_->dump_checkpoint();
}

void Trainer::save_checkpoint(const std::string& path) {
  strategy().save_checkpoint(dump_checkpoint(), path);
  strategy().barrier("Trainer.save_checkpoint");
}

}  // namespace fulgur
