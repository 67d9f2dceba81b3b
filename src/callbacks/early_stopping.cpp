// SPDX-License-Identifier: Apache-2.0
#include <fulgur/callbacks/early_stopping.h>
#include <fulgur/lightning_module.h>
#include <fulgur/strategies/strategy.h>
#include <fulgur/trainer.h>

#include "callbacks/monitor.h"
#include "runtime/log.h"

#include <cmath>
#include <limits>
#include <sstream>
#include <stdexcept>

namespace fulgur {

EarlyStopping::EarlyStopping(EarlyStoppingOptions options) : options_(std::move(options)) {
  detail::check_monitor_mode("EarlyStopping", options_.mode());
  if (options_.patience() < 0) {
    throw std::invalid_argument("EarlyStopping: patience=" + std::to_string(options_.patience()) + " must be >= 0");
  }
  if (options_.monitor().empty()) throw std::invalid_argument("EarlyStopping: monitor must name a logged metric");
  best_score_ = options_.mode() == "min" ? std::numeric_limits<double>::infinity()
                                        : -std::numeric_limits<double>::infinity();
}

std::string EarlyStopping::state_key() const {
  return "EarlyStopping{'monitor': '" + options_.monitor() + "', 'mode': '" + options_.mode() + "'}";
}

void EarlyStopping::on_validation_end(Trainer& trainer, LightningModule&) {
  saw_validation_ = true;
  check(trainer);
}

void EarlyStopping::on_train_epoch_end(Trainer& trainer, LightningModule&) {
  if (!saw_validation_ && !detail::acts_at_validation_end_only(trainer)) check(trainer);
}

void EarlyStopping::check(Trainer& trainer) {
  const auto& metrics = trainer.callback_metrics();
  auto it = metrics.find(options_.monitor());
  if (it == metrics.end()) {
    const std::string msg = "EarlyStopping could not find the monitored metric '" + options_.monitor() +
                            "' among the logged ones: " + detail::logged_names(metrics);
    if (options_.strict()) throw std::runtime_error(msg + "; log it, or set strict(false)");
    runtime::warn_rank_zero_once(msg);
    return;
  }
  const double current = it->second;
  const bool minimize = options_.mode() == "min";
  auto better = [&](double a, double b) { return detail::better_score(options_.mode(), a, b); };
  bool stop = false;
  std::ostringstream why;
  if (options_.check_finite() && !std::isfinite(current)) {
    stop = true;
    why << "Monitored metric " << options_.monitor() << " = " << current << " is not finite";
  } else if (options_.stopping_threshold() && better(current, *options_.stopping_threshold())) {
    stop = true;
    why << "Stopping threshold reached: " << options_.monitor() << " = " << current;
  } else if (options_.divergence_threshold() && better(*options_.divergence_threshold(), current)) {
    stop = true;
    why << "Divergence threshold exceeded: " << options_.monitor() << " = " << current;
  } else if (better(current - (minimize ? -1 : 1) * options_.min_delta(), best_score_)) {
    best_score_ = current;
    wait_count_ = 0;
  } else {
    ++wait_count_;
    if (wait_count_ >= options_.patience()) {
      stop = true;
      why << "Monitored metric " << options_.monitor() << " did not improve in the last " << wait_count_
          << " checks; best score " << best_score_;
    }
  }
  stop = trainer.strategy().reduce_boolean_decision(stop, DecisionRule::kAny);
  if (stop) {
    reason_ = why.str();
    stopped_epoch_ = trainer.current_epoch();
    trainer.set_should_stop(true);
    if (!reason_.empty()) runtime::log_rank_zero(runtime::LogLevel::kInfo, reason_ + ". Stopping.");
  }
}

c10::IValue EarlyStopping::state_dict() const {
  auto d = fulgur::make_dict();
  d.insert("wait_count", wait_count_);
  d.insert("stopped_epoch", stopped_epoch_);
  d.insert("best_score", best_score_);
  d.insert("patience", options_.patience());
  d.insert("reason", reason_);  // fulgur's; Lightning's loader reads the keys it knows
  return d;
}

void EarlyStopping::load_state_dict(const c10::IValue& state) {
  if (!state.isGenericDict()) return;
  auto d = c10::impl::toTypedDict<std::string, c10::IValue>(state.toGenericDict());
  wait_count_ = d.at("wait_count").toInt();
  stopped_epoch_ = d.at("stopped_epoch").toInt();
  best_score_ = d.at("best_score").toDouble();
  // Absent from Lightning's and older checkpoints.
  reason_ = d.contains("reason") && d.at("reason").isString() ? d.at("reason").toStringRef() : "";
}

}  // namespace fulgur
