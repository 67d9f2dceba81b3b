#include <fulgur/callbacks/model_checkpoint.h>
#include <fulgur/strategies/strategy.h>
#include <fulgur/trainer.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <stdexcept>

namespace fs = std::filesystem;

namespace fulgur {

ModelCheckpoint::ModelCheckpoint(ModelCheckpointOptions options) : options_(std::move(options)) {
  if (options_.mode() != "min" && options_.mode() != "max") {
    throw std::invalid_argument("ModelCheckpoint: mode '" + options_.mode() + "' is not known; valid: \"min\", \"max\"");
  }
  if (options_.save_top_k() < -1) {
    throw std::invalid_argument("ModelCheckpoint: save_top_k=" + std::to_string(options_.save_top_k()) +
                                " is invalid; use -1 (all), 0 (none) or a count");
  }
  if (options_.every_n_epochs() < 0 || options_.every_n_train_steps() < 0) {
    throw std::invalid_argument("ModelCheckpoint: every_n_epochs and every_n_train_steps must be >= 0");
  }
  dirpath_ = options_.dirpath();
}

std::string ModelCheckpoint::state_key() const {
  return "ModelCheckpoint{'monitor': '" + options_.monitor() + "', 'mode': '" + options_.mode() +
         "', 'every_n_train_steps': " + std::to_string(options_.every_n_train_steps()) +
         ", 'every_n_epochs': " + std::to_string(options_.every_n_epochs()) + "}";
}

void ModelCheckpoint::on_fit_start(Trainer& trainer, LightningModule&) {
  std::string dir = options_.dirpath();
  if (dir.empty() && trainer.is_global_zero()) dir = trainer.log_dir() + "/checkpoints";
  if (options_.dirpath().empty()) dir = trainer.strategy().broadcast(c10::IValue(dir), 0).toStringRef();
  dirpath_ = dir;
  if (trainer.is_global_zero()) TorchCheckpointIO::remove_stale_temporaries(dirpath_);
}

std::string ModelCheckpoint::format_name(int64_t epoch, int64_t step, const std::map<std::string, double>& metrics) const {
  const std::string& tpl = options_.filename();
  std::string out;
  size_t i = 0;
  while (i < tpl.size()) {
    if (tpl[i] != '{') {
      out += tpl[i++];
      continue;
    }
    const size_t close = tpl.find('}', i);
    if (close == std::string::npos) {
      throw std::invalid_argument("ModelCheckpoint: filename '" + tpl + "' has an unclosed '{'");
    }
    std::string field = tpl.substr(i + 1, close - i - 1);
    std::string spec;
    if (auto colon = field.find(':'); colon != std::string::npos) {
      spec = field.substr(colon + 1);
      field = field.substr(0, colon);
    }
    char buf[64];
    if (field == "epoch" || field == "step") {
      std::snprintf(buf, sizeof(buf), "%lld", static_cast<long long>(field == "epoch" ? epoch : step));
    } else {
      auto it = metrics.find(field);
      const double v = it == metrics.end() ? 0.0 : it->second;
      const std::string fmt = "%" + (spec.empty() ? std::string(".4f") : spec);
      std::snprintf(buf, sizeof(buf), fmt.c_str(), v);
    }
    out += field + "=" + buf;
    i = close + 1;
  }
  return out;
}

bool ModelCheckpoint::better(double a, double b) const { return options_.mode() == "min" ? a < b : a > b; }

void ModelCheckpoint::save(Trainer& trainer) {
  Strategy& strategy = trainer.strategy();
  // Rank 0 decides what to write and remove; every rank follows the plan, so
  // the collective saves happen in the same order everywhere.
  auto plan = fulgur::make_dict();
  if (trainer.is_global_zero()) {
    const auto& metrics = trainer.callback_metrics();
    std::optional<double> score;
    if (!options_.monitor().empty()) {
      auto it = metrics.find(options_.monitor());
      if (it == metrics.end()) {
        std::string logged;
        for (const auto& kv : metrics) logged += (logged.empty() ? "" : ", ") + kv.first;
        throw std::runtime_error("ModelCheckpoint(monitor='" + options_.monitor() +
                                 "') could not find that metric among the logged ones: [" + logged +
                                 "]; log it with self.log or fix the name");
      }
      score = it->second;
    }
    c10::List<std::string> writes;
    c10::List<std::string> removes;
    std::map<std::string, double> kept = best_k_models_;
    const int64_t k = options_.save_top_k();
    if (k != 0) {
      std::string path = dirpath_ + "/" + format_name(trainer.current_epoch(), trainer.global_step(), metrics) + ".ckpt";
      for (int v = 1; kept.count(path); ++v) {
        path = dirpath_ + "/" + format_name(trainer.current_epoch(), trainer.global_step(), metrics) + "-v" +
               std::to_string(v) + ".ckpt";
      }
      const double s = score.value_or(static_cast<double>(trainer.global_step()));
      bool save = k == -1 || static_cast<int64_t>(kept.size()) < k || !score;
      if (!save && score) {
        auto worst = std::max_element(kept.begin(), kept.end(), [&](const auto& a, const auto& b) {
          return better(a.second, b.second);
        });
        save = better(s, worst->second);
      }
      if (score && std::isnan(*score)) save = false;
      if (save) {
        writes.push_back(path);
        kept[path] = score ? s : static_cast<double>(trainer.global_step());
        while (k != -1 && static_cast<int64_t>(kept.size()) > k) {
          // Without a monitor the most recent are kept (score = step, larger is newer).
          auto worst = std::max_element(kept.begin(), kept.end(), [&](const auto& a, const auto& b) {
            return score ? better(a.second, b.second) : a.second > b.second;
          });
          removes.push_back(worst->first);
          kept.erase(worst);
        }
      }
    }
    if (options_.save_last()) writes.push_back(dirpath_ + "/last.ckpt");
    c10::Dict<std::string, double> kept_d;
    for (const auto& [p, s] : kept) kept_d.insert(p, s);
    plan.insert("writes", writes);
    plan.insert("removes", removes);
    plan.insert("kept", kept_d);
  }
  plan = c10::impl::toTypedDict<std::string, c10::IValue>(strategy.broadcast(c10::IValue(plan), 0).toGenericDict());
  best_k_models_.clear();
  for (const auto& kv : plan.at("kept").toGenericDict()) best_k_models_[kv.key().toStringRef()] = kv.value().toDouble();
  for (const auto& w : plan.at("writes").toListRef()) {
    const std::string& path = w.toStringRef();
    trainer.save_checkpoint(path);
    if (fs::path(path).filename() == "last.ckpt") last_model_path_ = path;
  }
  for (const auto& r : plan.at("removes").toListRef()) strategy.remove_checkpoint(r.toStringRef());
  if (!best_k_models_.empty()) {
    const bool monitored = !options_.monitor().empty();
    auto best = std::min_element(best_k_models_.begin(), best_k_models_.end(), [&](const auto& a, const auto& b) {
      return monitored ? better(a.second, b.second) : a.second > b.second;
    });
    best_model_path_ = best->first;
    if (monitored) best_model_score_ = best->second;
  }
  last_saved_step_ = trainer.global_step();
}

void ModelCheckpoint::on_train_batch_end(Trainer& trainer, LightningModule&, const StepOutput&, const Batch&, int64_t) {
  const int64_t n = options_.every_n_train_steps();
  if (n <= 0 || trainer.global_step() == 0 || trainer.global_step() % n != 0) return;
  if (trainer.global_step() == last_saved_step_) return;
  save(trainer);
}

void ModelCheckpoint::on_validation_end(Trainer& trainer, LightningModule&) {
  saw_validation_ = true;
  if (options_.every_n_train_steps() > 0 || options_.every_n_epochs() == 0) return;
  if ((trainer.current_epoch() + 1) % options_.every_n_epochs() != 0) return;
  if (trainer.global_step() == last_saved_step_) return;
  save(trainer);
}

void ModelCheckpoint::on_train_epoch_end(Trainer& trainer, LightningModule&) {
  if (saw_validation_ || options_.every_n_train_steps() > 0 || options_.every_n_epochs() == 0) return;
  if ((trainer.current_epoch() + 1) % options_.every_n_epochs() != 0) return;
  if (trainer.global_step() == last_saved_step_) return;
  save(trainer);
}

c10::IValue ModelCheckpoint::state_dict() const {
  auto d = fulgur::make_dict();
  d.insert("monitor", options_.monitor());
  d.insert("best_model_score", best_model_score_ ? c10::IValue(*best_model_score_) : c10::IValue());
  d.insert("best_model_path", best_model_path_);
  d.insert("last_model_path", last_model_path_);
  d.insert("dirpath", dirpath_);
  c10::Dict<std::string, double> k;
  for (const auto& [p, s] : best_k_models_) k.insert(p, s);
  d.insert("best_k_models", k);
  return d;
}

void ModelCheckpoint::load_state_dict(const c10::IValue& state) {
  if (!state.isGenericDict()) return;
  auto d = c10::impl::toTypedDict<std::string, c10::IValue>(state.toGenericDict());
  best_model_path_ = d.at("best_model_path").toStringRef();
  last_model_path_ = d.at("last_model_path").toStringRef();
  best_model_score_.reset();
  if (!d.at("best_model_score").isNone()) best_model_score_ = d.at("best_model_score").toDouble();
  best_k_models_.clear();
  for (const auto& kv : d.at("best_k_models").toGenericDict()) best_k_models_[kv.key().toStringRef()] = kv.value().toDouble();
}

}  // namespace fulgur
