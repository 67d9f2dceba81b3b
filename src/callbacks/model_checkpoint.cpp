// SPDX-License-Identifier: Apache-2.0
#include <fulgur/callbacks/model_checkpoint.h>
#include <fulgur/lightning_module.h>
#include <fulgur/strategies/strategy.h>
#include <fulgur/trainer.h>

#include "callbacks/monitor.h"
#include "runtime/log.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

namespace fs = std::filesystem;

namespace fulgur {
namespace {

// `p` made absolute, with symlinks of its existing part resolved and "." and
// ".." removed; empty when that fails.
fs::path resolved(const fs::path& p) {
  std::error_code ec;
  fs::path out = fs::weakly_canonical(fs::absolute(p, ec), ec);
  if (ec) return {};
  if (out.has_filename()) return out;
  return out.parent_path();  // "dir/" -> "dir"
}

// True when `path` lies strictly inside folder `dir` once both are resolved,
// so that neither ".." nor a symlink leads out of it.
bool lies_inside(const fs::path& dir, const fs::path& path) {
  const fs::path d = resolved(dir), p = resolved(path);
  if (d.empty() || p.empty()) return false;
  auto [di, pi] = std::mismatch(d.begin(), d.end(), p.begin(), p.end());
  return di == d.end() && pi != p.end();
}

std::string regex_escaped(const std::string& s) {
  static const std::string special = R"(\^$.|?*+()[]{})";
  std::string out;
  for (char c : s) {
    if (special.find(c) != std::string::npos) out += '\\';
    out += c;
  }
  return out;
}

// A field of the filename template and its format spec, in the part of Python's format-spec
// language Lightning users write: epoch and step take "[0][width]d" ({epoch:02d} gives
// epoch=01), a metric "[0][width][.precision]" and one of e, E, f, F, g, G ({val_loss:.3f}). The
// printf format is built from the parsed numbers, never from the user's text.
struct Field {
  std::string name;
  bool integer = false;  // epoch or step
  bool zero = false;
  int width = 0;
  int precision = -1;
  char conv = 'f';
};

Field parse_field(const std::string& text, const std::string& tpl) {
  Field f;
  std::string spec;
  const size_t colon = text.find(':');
  f.name = text.substr(0, colon);
  if (colon != std::string::npos) spec = text.substr(colon + 1);
  f.integer = f.name == "epoch" || f.name == "step";
  if (f.name.empty()) throw std::invalid_argument("ModelCheckpoint: filename '" + tpl + "' has an empty field '{}'");
  if (spec.empty()) {
    if (!f.integer) f.precision = 4;  // {val_loss} is val_loss=0.1234
    return f;
  }
  static const std::regex int_spec(R"((0?)([0-9]{0,2})d)"), float_spec(R"((0?)([0-9]{0,2})(?:\.([0-9]{1,2}))?([eEfFgG]))");
  std::smatch m;
  if (f.integer ? std::regex_match(spec, m, int_spec) : std::regex_match(spec, m, float_spec)) {
    f.zero = m[1].length() > 0;
    f.width = m[2].length() ? std::stoi(m[2]) : 0;
    if (!f.integer) {
      f.precision = m[3].matched ? std::stoi(m[3]) : -1;
      f.conv = m[4].str()[0];
    }
    return f;
  }
  throw std::invalid_argument("ModelCheckpoint: filename '" + tpl + "': the format '" + spec + "' of '" + f.name +
                              "' is not allowed; " +
                              (f.integer ? "epoch and step take an integer format [0][width]d, e.g. {" + f.name + ":02d}"
                                         : "a metric takes a float format [0][width][.precision] and one of e E f F g "
                                           "G, e.g. {" + f.name + ":.3f}"));
}

// The template's literal text and fields in order; throws for an unclosed '{' or a bad format.
std::vector<std::variant<std::string, Field>> parse_template(const std::string& tpl) {
  std::vector<std::variant<std::string, Field>> parts;
  size_t i = 0;
  while (i < tpl.size()) {
    const size_t open = tpl.find('{', i);
    if (open != i) parts.emplace_back(tpl.substr(i, open == std::string::npos ? std::string::npos : open - i));
    if (open == std::string::npos) break;
    const size_t close = tpl.find('}', open);
    if (close == std::string::npos) throw std::invalid_argument("ModelCheckpoint: filename '" + tpl + "' has an unclosed '{'");
    parts.emplace_back(parse_field(tpl.substr(open + 1, close - open - 1), tpl));
    i = close + 1;
  }
  return parts;
}

std::string formatted(const Field& f, double metric, int64_t integer) {
  std::string fmt = "%";
  if (f.zero) fmt += "0";
  if (f.width > 0) fmt += std::to_string(f.width);
  if (f.integer) {
    fmt += "lld";
  } else {
    if (f.precision >= 0) fmt += "." + std::to_string(f.precision);
    fmt += f.conv;
  }
  // Measured first, then written: no fixed-size buffer cuts a long number.
  auto print = [&](char* buf, size_t size) {
    return f.integer ? std::snprintf(buf, size, fmt.c_str(), static_cast<long long>(integer))
                     : std::snprintf(buf, size, fmt.c_str(), metric);
  };
  std::string out(static_cast<size_t>(std::max(print(nullptr, 0), 0)), '\0');
  print(out.data(), out.size() + 1);  // C++17 strings keep room for the terminator
  return out;
}

}  // namespace

ModelCheckpoint::ModelCheckpoint(ModelCheckpointOptions options) : options_(std::move(options)) {
  detail::check_monitor_mode("ModelCheckpoint", options_.mode());
  parse_template(options_.filename());  // a bad template fails here, not at the first save
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
  drop_foreign_paths(trainer.is_global_zero());
  if (restored_) remove_orphans(trainer);
  restored_ = false;
}

void ModelCheckpoint::drop_foreign_paths(bool warn) {
  // One line for all of them: a resume into a new version folder drops every entry at once.
  std::string dropped;
  auto foreign = [&](const std::string& path, const char* what) {
    if (path.empty() || lies_inside(dirpath_, path)) return false;
    dropped += (dropped.empty() ? "" : ", ") + std::string(what) + " '" + path + "'";
    return true;
  };
  for (auto it = best_k_models_.begin(); it != best_k_models_.end();) {
    it = foreign(it->first, "the top-k checkpoint") ? best_k_models_.erase(it) : std::next(it);
  }
  if (foreign(last_model_path_, "the last checkpoint")) last_model_path_.clear();
  if (foreign(best_model_path_, "the best checkpoint")) {
    best_model_path_.clear();
    best_model_score_.reset();
  }
  if (warn && !dropped.empty()) {
    runtime::log_rank_zero(runtime::LogLevel::kWarning,
                           "warning: ModelCheckpoint: the restored state names " + dropped +
                               ", which are not inside this callback's folder '" + dirpath_ +
                               "'; these entries are dropped, and those files will not be used or removed");
  }
}

bool ModelCheckpoint::has_own_name(const std::string& relative) const {
  // The regex counterpart of format_name: "name=<number>" per field (a width pads with
  // spaces), then an optional "-v<k>" (a name taken twice) and ".ckpt".
  std::string re;
  for (const auto& part : parse_template(options_.filename())) {
    if (const auto* text = std::get_if<std::string>(&part)) {
      re += regex_escaped(*text);
    } else {
      const Field& f = std::get<Field>(part);
      re += regex_escaped(f.name) + (f.integer ? "= *-?[0-9]+" : "=[-+0-9.eEinfaINFA ]+");
    }
  }
  re += R"((-v[0-9]+)?\.ckpt)";
  return std::regex_match(relative, std::regex(re));
}

void ModelCheckpoint::remove_orphans(Trainer& trainer) {
  const int64_t k = options_.save_top_k();
  if (k == -1 || trainer.strategy().local_rank() != 0) return;
  std::error_code ec;
  if (!fs::is_directory(dirpath_, ec)) return;
  std::vector<fs::path> kept;
  for (const auto& kv : best_k_models_) kept.push_back(resolved(kv.first));
  std::vector<std::string> orphans;
  auto consider = [&](const fs::directory_entry& e) {
    if (e.is_symlink(ec) || !e.is_regular_file(ec) || e.path().filename() == "last.ckpt") return;
    if (!has_own_name(e.path().lexically_relative(dirpath_).generic_string())) return;
    if (std::find(kept.begin(), kept.end(), resolved(e.path())) != kept.end()) return;
    orphans.push_back(e.path().string());
  };
  if (options_.filename().find('/') == std::string::npos) {
    for (const auto& e : fs::directory_iterator(dirpath_, ec)) consider(e);
  } else {
    for (const auto& e : fs::recursive_directory_iterator(dirpath_, ec)) consider(e);
  }
  std::sort(orphans.begin(), orphans.end());
  std::string removed;
  for (const auto& o : orphans) {
    trainer.strategy().remove_checkpoint(o);
    removed += (removed.empty() ? "" : ", ") + o;
  }
  if (!removed.empty()) {
    runtime::log(runtime::LogLevel::kInfo, "ModelCheckpoint: removed " + removed +
                                               ": checkpoints of this callback's name pattern that the restored state "
                                               "does not keep (left by an interrupted run; save_top_k=" +
                                               std::to_string(k) + ")");
  }
}

std::string ModelCheckpoint::format_name(int64_t epoch, int64_t step, const std::map<std::string, double>& metrics) const {
  std::string out;
  for (const auto& part : parse_template(options_.filename())) {
    if (const auto* text = std::get_if<std::string>(&part)) {
      out += *text;
      continue;
    }
    const Field& f = std::get<Field>(part);
    const auto it = metrics.find(f.name);
    out += f.name + "=" + formatted(f, it == metrics.end() ? 0.0 : it->second, f.name == "epoch" ? epoch : step);
  }
  return out;
}

bool ModelCheckpoint::better(double a, double b) const { return detail::better_score(options_.mode(), a, b); }

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
        throw std::runtime_error("ModelCheckpoint(monitor='" + options_.monitor() +
                                 "') could not find that metric among the logged ones: " +
                                 detail::logged_names(metrics) + "; log it with self.log or fix the name");
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
  for (const auto& r : plan.at("removes").toListRef()) {
    // Only files of this callback's own folder are ever removed.
    if (lies_inside(dirpath_, r.toStringRef())) strategy.remove_checkpoint(r.toStringRef());
  }
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
  if (saw_validation_ || detail::acts_at_validation_end_only(trainer) || options_.every_n_train_steps() > 0 ||
      options_.every_n_epochs() == 0)
    return;
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
  // The folder rank 0 wrote to (what the launching process reads after a fit on several
  // processes); a resumed fit decides its own folder again at fit start.
  if (d.contains("dirpath") && d.at("dirpath").isString()) dirpath_ = d.at("dirpath").toStringRef();
  best_model_score_.reset();
  if (!d.at("best_model_score").isNone()) best_model_score_ = d.at("best_model_score").toDouble();
  best_k_models_.clear();
  for (const auto& kv : d.at("best_k_models").toGenericDict()) best_k_models_[kv.key().toStringRef()] = kv.value().toDouble();
  // Checked at the next fit start, once the folder is known (its default
  // depends on the logger).
  restored_ = true;
}

}  // namespace fulgur
