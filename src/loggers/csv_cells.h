// SPDX-License-Identifier: Apache-2.0
#pragma once
// The cells of one line of metrics.csv as RFC 4180 writes them (Python's csv module, pandas): a
// cell holding ',' or '"' is in double quotes with '"' doubled. Metric names hold no line break
// (log() refuses them), so a line is a row. Header-only and without libtorch: fulgur-plot uses it.

#include <string>
#include <vector>

namespace fulgur::detail {

inline std::vector<std::string> split_csv_line(const std::string& line) {
  std::vector<std::string> cells(1);
  bool quoted = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (c == '"' && quoted && i + 1 < line.size() && line[i + 1] == '"') {
      cells.back() += '"';
      ++i;
    } else if (c == '"') {
      quoted = !quoted;
    } else if (c == ',' && !quoted) {
      cells.emplace_back();
    } else {
      cells.back() += c;
    }
  }
  return cells;
}

// `cell` as RFC 4180 writes it: in double quotes, with '"' doubled, when it holds ',' or '"'.
inline std::string csv_cell(const std::string& cell) {
  if (cell.find_first_of(",\"") == std::string::npos) return cell;
  std::string out = "\"";
  for (char c : cell) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

}  // namespace fulgur::detail
