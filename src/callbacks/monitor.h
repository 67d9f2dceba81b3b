#pragma once
// What ModelCheckpoint and EarlyStopping share about a monitored metric: its
// mode ("min" or "max") and the names listed when it was not logged.

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

}  // namespace fulgur::detail
