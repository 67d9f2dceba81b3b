// SPDX-License-Identifier: Apache-2.0
#pragma once
// What ModelCheckpoint and EarlyStopping share about a monitored metric: its
// mode ("min" or "max") and the names listed when it was not logged.

#include <fulgur/trainer.h>

#include <map>
#include <stdexcept>
#include <string>

namespace fulgur::detail {

// Throws std::invalid_argument naming `who` and `mode` unless it is "min" or "max".
inline void check_monitor_mode(const std::string& who, const std::string& mode) {
  if (mode != "min" && mode != "max") {
    throw std::invalid_argument(who + ": mode '" + mode + "' is not known; valid: \"min\", \"max\"");
  }
}

// Whether score `a` is better than `b`: smaller under "min", larger under "max".
inline bool better_score(const std::string& mode, double a, double b) { return mode == "min" ? a < b : a > b; }

// "[a, b]": the names of the logged metrics, for a message about a monitor
// that is not among them.
inline std::string logged_names(const std::map<std::string, double>& metrics) {
  std::string out;
  for (const auto& kv : metrics) out += (out.empty() ? "" : ", ") + kv.first;
  return "[" + out + "]";
}

// Whether a monitored callback acts at validation end only: fit validates, but not every epoch
// (check_val_every_n_epoch > 1), so train-epoch ends without validation have no validation
// metric to judge (Lightning: ModelCheckpoint's _should_save_on_train_epoch_end and
// EarlyStopping's _check_on_train_epoch_end are false then).
inline bool acts_at_validation_end_only(const Trainer& trainer) {
  return trainer.num_val_batches() > 0 && trainer.options().check_val_every_n_epoch() > 1;
}

}  // namespace fulgur::detail
