// SPDX-License-Identifier: Apache-2.0
#pragma once
// Lightning's logger prefix: "<prefix>-<name>" for every metric name.

#include <map>
#include <string>

namespace fulgur::detail {

// `metrics` with each name as "<prefix>-<name>"; unchanged when `prefix` is empty.
inline std::map<std::string, double> with_prefix(const std::map<std::string, double>& metrics, const std::string& prefix) {
  if (prefix.empty()) return metrics;
  std::map<std::string, double> out;
  for (const auto& [name, value] : metrics) out.emplace(prefix + "-" + name, value);
  return out;
}

}  // namespace fulgur::detail
