// SPDX-License-Identifier: Apache-2.0
// Checkpoints of the whole run: dump (Lightning's dict layout), restore (every
// count checked before it is used), ckpt_path's "last" and "best", and the
// resume of a restarted launch.

#include "trainer/connectors/checkpoint_connector.h"

#include <fulgur/callbacks/model_checkpoint.h>
#include <fulgur/checkpoint.h>
#include <fulgur/data/data_loader.h>
#include <fulgur/lr_scheduler.h>
#include <fulgur/plugins/precision/precision.h>
#include <fulgur/strategies/strategy.h>
#include <fulgur/trainer.h>
#include <fulgur/version.h>
#include <fulgur/xla/random.h>

#include "launchers/restarts.h"
#include "optim/optim_state.h"
#include "runtime/log.h"
#include "trainer/checkpoint_read.h"
#include "trainer/progress.h"
#include "trainer/trainer_impl.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <filesystem>
#include <limits>
#include <stdexcept>

namespace fs = std::filesystem;

namespace fulgur::detail {

c10::IValue checkpoint_entry(const Checkpoint& checkpoint, const std::vector<std::string>& path,
                             const std::string& where, const c10::TypePtr& type) {
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

int64_t check_count(int64_t n, const std::string& where, const std::string& name, int64_t bound, const std::string& why) {
  if (n < 0 || n > bound) {
    throw std::runtime_error(where + ": '" + name + "' is " + std::to_string(n) + ", outside [0, " + std::to_string(bound) +
                             "] (" + why + "); the checkpoint is corrupt or was made for another run");
  }
  return n;
}

namespace {

// Whether the model's parameters are on a lazy (xla) device: then its random ops drew from the
// xla device generator. Asked of the parameters, not of the strategy, whose root_device() throws
// in the launching process of a multi-process xla run.
bool on_xla_device(const LightningModule& model) {
  const auto params = model.parameters();
  return !params.empty() && params.front().device().type() == c10::kLazy;
}

}  // namespace

Checkpoint CheckpointConnector::dump() {
  Checkpoint ckpt = make_dict();
  ckpt.insert("epoch", t_.progress.epoch);
  ckpt.insert("global_step", t_.progress.global_step);
  ckpt.insert("pytorch-lightning_version", std::string("2.1.0"));
  ckpt.insert("fulgur_format_version", static_cast<int64_t>(FULGUR_CHECKPOINT_FORMAT_VERSION));
  ckpt.insert("fulgur_version", fulgur::version());
  ckpt.insert("state_dict", state_dict(*t_.model));
  c10::impl::GenericList opt_states(c10::AnyType::get());
  for (auto& opt : t_.strategy->optimizer_config().optimizers) opt_states.push_back(optimizer_state_dict(*opt));
  ckpt.insert("optimizer_states", opt_states);
  c10::impl::GenericList sched_states(c10::AnyType::get());
  for (size_t i = 0; i < t_.strategy->optimizer_config().schedulers.size(); ++i) {
    auto s = fulgur::make_dict();
    s.insert("_step_count", t_.progress.scheduler_counts.at(i) + 1);
    s.insert("last_epoch", t_.progress.scheduler_counts.at(i));
    const SchedulerConfig& sc = t_.strategy->optimizer_config().schedulers[i];
    if (const auto* plateau = dynamic_cast<const lr_scheduler::ReduceLROnPlateau*>(sc.scheduler().get())) {
      // Python's ReduceLROnPlateau.state_dict keys; and, for a checkpoint written before this
      // epoch's scheduler step, the value that step takes (the monitored metric now).
      s.insert("best", plateau->best());
      s.insert("num_bad_epochs", plateau->num_bad_epochs());
      s.insert("cooldown_counter", plateau->cooldown_counter());
      t_.logging.materialize_metrics();
      if (const auto it = t_.logging.callback_metrics.find(sc.monitor()); it != t_.logging.callback_metrics.end())
        s.insert("fulgur_pending_metric", it->second);
    }
    sched_states.push_back(s);
  }
  ckpt.insert("lr_schedulers", sched_states);
  // The precision plugin's state (16-mixed's GradScaler), under Lightning's key.
  if (auto precision_state = t_.strategy->precision().state_dict()) ckpt.insert(Precision::checkpoint_key(), *precision_state);
  ckpt.insert("callbacks", callback_states());
  auto loops = fulgur::make_dict();
  loops.insert("fit_loop", t_.progress.to_ivalue(t_.strategy->world_size()));
  ckpt.insert("loops", loops);
  // Every rank's generator state, so each rank resumes its own random stream.
  auto rng = at::detail::getDefaultCPUGenerator().get_state();
  auto rng_states = fulgur::make_dict();
  at::Tensor gathered = t_.strategy->all_gather(rng).to(torch::kCPU);
  if (gathered.dim() == 1) gathered = gathered.unsqueeze(0);  // one process: no gather happened
  rng_states.insert("torch", gathered);
  // On xla devices every rank's device generator state (key, offset) too: a resumed run draws
  // what the uninterrupted one would have (its dropout masks included). Saved, not derived
  // from the seed and the global step, because draws do not come one set per step: validation
  // and a user's own draws advance it as well, as they advance the CPU generator.
  if (on_xla_device(*t_.model)) {
    at::Tensor xla_states = t_.strategy->all_gather(xla::rng_state()).to(torch::kCPU);
    if (xla_states.dim() == 1) xla_states = xla_states.unsqueeze(0);
    rng_states.insert("xla", xla_states);
  }
  ckpt.insert("rng_states", rng_states);
  ckpt.insert("hyper_parameters", t_.model->hparams());
  t_.model->on_save_checkpoint(ckpt);
  for (auto& c : t_.callbacks) c->on_save_checkpoint(t_.owner, *t_.model, ckpt);
  return ckpt;
}
namespace {

// libtorch's LRScheduler counts its steps in an unsigned int.
constexpr int64_t kMaxSchedulerCount = std::numeric_limits<unsigned>::max();

// The int under `key` of `d`, in [0, bound] (check_count).
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

c10::Dict<std::string, c10::IValue> CheckpointConnector::callback_states() const {
  auto states = fulgur::make_dict();
  for (const auto& c : t_.callbacks) {
    auto s = c->state_dict();
    if (!s.isNone()) states.insert(c->state_key(), s);
  }
  return states;
}

void CheckpointConnector::load_callback_states(const c10::IValue& states) {
  const auto d = c10::impl::toTypedDict<std::string, c10::IValue>(states.toGenericDict());
  for (auto& c : t_.callbacks)
    if (d.contains(c->state_key())) c->load_state_dict(d.at(c->state_key()));
}

namespace {

// ckpt[key], which every checkpoint of fulgur's has.
c10::IValue required(const Checkpoint& ckpt, const char* key, const std::string& where) {
  if (!ckpt.contains(key)) throw std::runtime_error(where + ": missing key '" + key + "'");
  return ckpt.at(key);
}

// A format newer than this fulgur's may mean what it reads differently: refused, naming both.
void check_format(const Checkpoint& ckpt, const std::string& where) {
  if (!ckpt.contains("fulgur_format_version")) return;
  const c10::IValue f = ckpt.at("fulgur_format_version");
  if (!f.isInt()) throw std::runtime_error(where + ": 'fulgur_format_version' is not an int");
  if (f.toInt() > FULGUR_CHECKPOINT_FORMAT_VERSION) {
    const c10::IValue v = ckpt.contains("fulgur_version") ? ckpt.at("fulgur_version") : c10::IValue();
    throw std::runtime_error(where + ": written by fulgur " + (v.isString() ? v.toStringRef() : std::string("(unknown)")) +
                             " in checkpoint format " + std::to_string(f.toInt()) + "; this fulgur " + fulgur::version() +
                             " reads formats up to " + std::to_string(FULGUR_CHECKPOINT_FORMAT_VERSION) +
                             ". Resume with that fulgur or a newer one");
  }
}

}  // namespace

void CheckpointConnector::restore(const std::string& path) {
  Checkpoint ckpt = t_.strategy->load_checkpoint(path);
  const std::string where = "checkpoint " + path;
  check_format(ckpt, where);
  auto sd = required(ckpt, "state_dict", where);
  if (!sd.isGenericDict()) throw std::runtime_error(where + ": 'state_dict' is not a dict");
  load_state_dict(*t_.model, c10::impl::toTypedDict<std::string, c10::IValue>(sd.toGenericDict()), true, where);
  if (t_.stage != Stage::kFit) return;
  restore_training_state(ckpt, where);
}

void CheckpointConnector::restore_training_state(Checkpoint& ckpt, const std::string& where) {
  // The loop and generator state first: a checkpoint without it is refused before anything is restored.
  const Progress saved = Progress::from_checkpoint(ckpt, where, t_.fit_loop.train_source->num_batches());
  const at::Tensor rng_states = ckpt.contains("rng_states")
                                    ? checkpoint_entry(ckpt, {"rng_states", "torch"}, where, c10::TensorType::get()).toTensor()
                                    : at::Tensor();
  // The xla device generator's states, in checkpoints of runs on xla devices only.
  at::Tensor xla_rng_states;
  if (rng_states.defined() && on_xla_device(*t_.model) &&
      checkpoint_entry(ckpt, {"rng_states"}, where).toGenericDict().contains("xla"))
    xla_rng_states = checkpoint_entry(ckpt, {"rng_states", "xla"}, where, c10::TensorType::get()).toTensor();
  auto opts = required(ckpt, "optimizer_states", where).toList();
  const auto& cfg = t_.strategy->optimizer_config();
  if (opts.size() != cfg.optimizers.size()) {
    throw std::runtime_error(where + ": has " + std::to_string(opts.size()) + " optimizer states, the model configures " +
                             std::to_string(cfg.optimizers.size()) + " optimizers");
  }
  t_.progress.epoch = saved.epoch;
  t_.progress.global_step = saved.global_step;
  t_.progress.batches_done = saved.batches_done;
  // A checkpoint of a finished epoch written before the per-epoch schedulers stepped (last.ckpt
  // at validation end): the resumed run takes that step below, as the uninterrupted run did.
  const bool pending_epoch_step = saved.epoch_finished && !saved.epoch_schedulers_stepped;
  if (saved.epoch_finished) {
    ++t_.progress.epoch;
    t_.progress.batches_done = 0;
  }
  // A scheduler takes its saved count directly (no replay, whatever the
  // count); its learning rate comes back with the optimizer's state below.
  auto scheds = required(ckpt, "lr_schedulers", where).toList();
  restore_schedulers(scheds, where);
  for (size_t i = 0; i < opts.size(); ++i) {
    load_optimizer_state_dict(*cfg.optimizers[i], opts.get(i), where + ", optimizer " + std::to_string(i));
    optimizer_state_to_params_device(*cfg.optimizers[i]);
  }
  if (t_.strategy->precision().scaler() && ckpt.contains(Precision::checkpoint_key())) {
    const c10::IValue p = ckpt.at(Precision::checkpoint_key());
    if (!p.isGenericDict()) throw std::runtime_error(where + ": '" + Precision::checkpoint_key() + "' is not a dict");
    t_.strategy->precision().load_state_dict(c10::impl::toTypedDict<std::string, c10::IValue>(p.toGenericDict()), where);
  }
  if (pending_epoch_step) step_pending_epoch_schedulers(scheds);
  const c10::IValue cbs = required(ckpt, "callbacks", where);
  if (!cbs.isGenericDict()) throw std::runtime_error(where + ": 'callbacks' is not a dict");
  load_callback_states(cbs);
  for (auto& c : t_.callbacks) c->on_load_checkpoint(t_.owner, *t_.model, ckpt);
  if (rng_states.defined() && rng_states.dim() == 2 && rng_states.size(0) == t_.strategy->world_size()) {
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    // A tensor of its own: libtorch 2.11's CPU generator crashes on a state that is a view at a
    // storage offset (a row of the gathered states).
    gen.set_state(rng_states[t_.strategy->global_rank()].clone());
  }
  if (xla_rng_states.defined() && xla_rng_states.dim() == 2 && xla_rng_states.size(0) == t_.strategy->world_size() &&
      xla_rng_states.size(1) == 2 && xla_rng_states.scalar_type() == at::kLong)
    xla::set_rng_state(xla_rng_states[t_.strategy->global_rank()].clone());
  t_.model->on_load_checkpoint(ckpt);
}

void CheckpointConnector::restore_schedulers(const c10::List<c10::IValue>& scheds, const std::string& where) {
  const auto& cfg = t_.strategy->optimizer_config();
  for (size_t i = 0; i < cfg.schedulers.size() && i < scheds.size(); ++i) {
    if (!scheds.get(i).isGenericDict()) throw std::runtime_error(where + ": lr_schedulers[" + std::to_string(i) + "] is not a dict");
    auto s = c10::impl::toTypedDict<std::string, c10::IValue>(scheds.get(i).toGenericDict());
    const SchedulerConfig& sc = cfg.schedulers[i];
    const bool per_step = sc.interval() == "step";
    const int64_t bound = std::min<int64_t>(per_step ? t_.progress.global_step : t_.progress.epoch + 1, kMaxSchedulerCount);
    const int64_t n = read_count(s, "last_epoch", where, "lr_schedulers[" + std::to_string(i) + "].last_epoch", bound,
                                 per_step ? "a scheduler stepped per optimizer step, and the checkpoint's global_step is " +
                                                std::to_string(t_.progress.global_step)
                                          : "a scheduler stepped per epoch, and the checkpoint is in epoch " +
                                                std::to_string(t_.progress.epoch));
    if (auto* plateau = dynamic_cast<lr_scheduler::ReduceLROnPlateau*>(sc.scheduler().get())) {
      const std::string at = "lr_schedulers[" + std::to_string(i) + "].";
      auto value = [&](const char* key) -> c10::IValue {
        const auto it = s.find(key);
        if (it == s.end()) throw std::runtime_error(where + ": missing key '" + at + key + "' of a ReduceLROnPlateau");
        return it->value();
      };
      const c10::IValue best = value("best");
      if (!best.isDouble()) throw std::runtime_error(where + ": '" + at + "best' is not a float");
      const int64_t bound = std::min<int64_t>(n, kMaxSchedulerCount);
      plateau->restore(best.toDouble(), read_count(s, "num_bad_epochs", where, at + "num_bad_epochs", bound, "at most its steps"),
                       read_count(s, "cooldown_counter", where, at + "cooldown_counter", plateau->options().cooldown(),
                                  "at most its cooldown"),
                       n);
    } else {
      set_scheduler_step_count(*sc.scheduler(), n);
    }
    t_.progress.scheduler_counts[i] = n;
  }
}

void CheckpointConnector::step_pending_epoch_schedulers(const c10::List<c10::IValue>& scheds) {
  const auto& cfg = t_.strategy->optimizer_config();
  // The step the finished epoch's end took after the checkpoint (step_schedulers("epoch")
  // with current_epoch still that epoch), after the optimizers' rates are restored.
  for (size_t i = 0; i < cfg.schedulers.size() && i < scheds.size(); ++i) {
    const SchedulerConfig& sc = cfg.schedulers[i];
    if (sc.interval() != "epoch" || t_.progress.epoch % std::max<int64_t>(1, sc.frequency()) != 0) continue;
    if (auto* plateau = dynamic_cast<lr_scheduler::ReduceLROnPlateau*>(sc.scheduler().get())) {
      auto s = c10::impl::toTypedDict<std::string, c10::IValue>(scheds.get(i).toGenericDict());
      const auto it = s.find("fulgur_pending_metric");
      if (it == s.end() || !it->value().isDouble()) continue;  // no value was logged then: no step, as then
      plateau->step(it->value().toDouble());
    } else {
      sc.scheduler()->step();
    }
    ++t_.progress.scheduler_counts[i];
  }
}

std::string CheckpointConnector::resolve_ckpt_path(const std::string& ckpt_path) const {
  if (ckpt_path.empty()) return "";
  auto* mc = t_.owner.checkpoint_callback();
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
  const fs::path root = fs::path(t_.options.default_root_dir()) / "lightning_logs";
  if (fs::is_directory(root, ec)) {
    for (const auto& v : fs::directory_iterator(root, ec)) candidates.push_back(v.path() / "checkpoints" / "last.ckpt");
  }
  candidates.push_back(fs::path(t_.options.default_root_dir()) / "checkpoints" / "last.ckpt");
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
    runtime::warn_rank_zero_once("ckpt_path=\"last\" but no last.ckpt was found under " + t_.options.default_root_dir() +
                                 "; starting from scratch");
    return "";
  }
  return best.string();
}

std::string CheckpointConnector::resume_after_restart(const std::string& ckpt_path) {
  // Rank 0 reads the records in node 0's launch folder; every rank restores the same file.
  const std::string mine = t_.strategy->is_global_zero() ? last_checkpoint_of_this_launch() : "";
  const std::string found = t_.strategy->broadcast(c10::IValue(mine), 0).toStringRef();
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

}  // namespace fulgur::detail
