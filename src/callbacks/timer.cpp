// SPDX-License-Identifier: Apache-2.0
#include <fulgur/callbacks/timer.h>
#include <fulgur/strategies/strategy.h>
#include <fulgur/trainer.h>

#include "runtime/log.h"

#include <cstdio>
#include <regex>
#include <stdexcept>

namespace fulgur {
namespace {

const char* const kStages[] = {"train", "validate", "test", "predict"};

// "1 day, 02:03:04" style, as Python's timedelta prints whole seconds.
std::string format_seconds(double seconds) {
  const auto s = static_cast<int64_t>(seconds);
  char buf[64];
  const int64_t days = s / 86400;
  std::snprintf(buf, sizeof(buf), "%d:%02d:%02d", static_cast<int>((s % 86400) / 3600), static_cast<int>((s % 3600) / 60),
                static_cast<int>(s % 60));
  return (days > 0 ? std::to_string(days) + (days == 1 ? " day, " : " days, ") : "") + buf;
}

}  // namespace

TimerOptions& TimerOptions::duration(const std::string& dd_hh_mm_ss) {
  static const std::regex form(R"((\d+):(\d\d):(\d\d):(\d\d))");
  std::smatch m;
  std::string text = dd_hh_mm_ss;
  text.erase(0, text.find_first_not_of(" \t"));
  text.erase(text.find_last_not_of(" \t") + 1);
  if (!std::regex_match(text, m, form)) {
    throw std::invalid_argument("Timer: duration \"" + dd_hh_mm_ss +
                                "\" is not a valid duration; give \"DD:HH:MM:SS\" (e.g. \"00:12:00:00\"), or "
                                "std::chrono seconds");
  }
  duration_ = std::chrono::duration<double>(std::stod(m[1]) * 86400 + std::stod(m[2]) * 3600 + std::stod(m[3]) * 60 +
                                            std::stod(m[4]));
  return *this;
}

Timer::Timer(TimerOptions options) : options_(std::move(options)) {
  if (options_.interval() != "step" && options_.interval() != "epoch") {
    throw std::invalid_argument("Timer: interval '" + options_.interval() + "' is not known; valid: \"step\", \"epoch\"");
  }
  if (options_.duration() && options_.duration()->count() < 0) {
    throw std::invalid_argument("Timer: duration=" + std::to_string(options_.duration()->count()) +
                                "s is negative; give a duration >= 0, or none to only measure");
  }
  for (const char* s : kStages) spans_[s];
}

const Timer::Span& Timer::span(const std::string& stage) const {
  const auto it = spans_.find(stage);
  if (it == spans_.end()) {
    throw std::invalid_argument("Timer: stage '" + stage + "' is not known; valid: \"train\", \"validate\", \"test\", \"predict\"");
  }
  return it->second;
}

double Timer::time_elapsed(const std::string& stage) const {
  const Span& s = span(stage);
  const double offset = stage == "train" ? offset_ : 0.0;
  if (!s.start) return offset;
  const Clock::time_point end = s.end ? *s.end : Clock::now();
  return std::chrono::duration<double>(end - *s.start).count() + offset;
}

std::optional<double> Timer::time_remaining(const std::string& stage) const {
  if (!options_.duration()) return std::nullopt;
  return options_.duration()->count() - time_elapsed(stage);
}

void Timer::check_time_remaining(Trainer& trainer) {
  if (!options_.duration()) return;
  // Rank 0's clock decides for every rank, as Lightning broadcasts its decision.
  bool stop = time_elapsed("train") >= options_.duration()->count();
  stop = trainer.strategy().broadcast(c10::IValue(stop), 0).toBool();
  if (!stop) return;
  trainer.set_should_stop(true);
  reason_ = "Timer: time limit of " + format_seconds(options_.duration()->count()) + " reached (elapsed " +
            format_seconds(time_elapsed("train")) + ")";
  if (options_.verbose()) {
    runtime::log_rank_zero(runtime::LogLevel::kInfo,
                           "Time limit reached. Elapsed time is " + format_seconds(time_elapsed("train")) +
                               ". Signaling Trainer to stop.");
  }
}

void Timer::on_fit_start(Trainer& trainer, LightningModule&) {
  // After the restore: a resumed run whose time is already spent stops before its first batch.
  reason_.clear();
  check_time_remaining(trainer);
}

void Timer::on_train_start(Trainer&, LightningModule&) {
  spans_["train"] = Span{Clock::now(), std::nullopt};
}

void Timer::on_train_end(Trainer&, LightningModule&) { spans_["train"].end = Clock::now(); }

void Timer::on_train_batch_end(Trainer& trainer, LightningModule&, const StepOutput&, const Batch&, int64_t) {
  if (options_.interval() == "step") check_time_remaining(trainer);
}

void Timer::on_train_epoch_end(Trainer& trainer, LightningModule&) {
  if (options_.interval() == "epoch") check_time_remaining(trainer);
}

void Timer::on_validation_epoch_start(Trainer&, LightningModule&) {
  spans_["validate"] = Span{Clock::now(), std::nullopt};
}

void Timer::on_validation_epoch_end(Trainer&, LightningModule&) { spans_["validate"].end = Clock::now(); }
void Timer::on_test_start(Trainer&, LightningModule&) { spans_["test"] = Span{Clock::now(), std::nullopt}; }
void Timer::on_test_end(Trainer&, LightningModule&) { spans_["test"].end = Clock::now(); }
void Timer::on_predict_start(Trainer&, LightningModule&) { spans_["predict"] = Span{Clock::now(), std::nullopt}; }
void Timer::on_predict_end(Trainer&, LightningModule&) { spans_["predict"].end = Clock::now(); }

c10::IValue Timer::state_dict() const {
  auto elapsed = make_dict();
  for (const char* s : kStages) elapsed.insert(s, time_elapsed(s));
  auto d = make_dict();
  d.insert("time_elapsed", elapsed);
  return d;
}

void Timer::load_state_dict(const c10::IValue& state) {
  if (!state.isGenericDict()) return;
  const auto d = c10::impl::toTypedDict<std::string, c10::IValue>(state.toGenericDict());
  if (!d.contains("time_elapsed") || !d.at("time_elapsed").isGenericDict()) return;
  const auto elapsed = c10::impl::toTypedDict<std::string, c10::IValue>(d.at("time_elapsed").toGenericDict());
  if (elapsed.contains("train") && elapsed.at("train").isDouble()) offset_ = elapsed.at("train").toDouble();
  // The new run's own training time starts again from the restored total.
  spans_["train"] = Span{};
}

}  // namespace fulgur
