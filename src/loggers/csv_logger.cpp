// SPDX-License-Identifier: Apache-2.0
#include <fulgur/loggers/csv_logger.h>

#include "loggers/csv_cells.h"
#include "loggers/hparams_yaml.h"
#include "loggers/next_version.h"
#include "loggers/prefix.h"

#include <filesystem>
#include <fstream>
#include <iomanip>
#include <limits>
#include <set>
#include <sstream>
#include <stdexcept>

namespace fs = std::filesystem;

namespace fulgur {
namespace {

// One line of metrics.csv, each cell as RFC 4180 writes it (loggers/csv_cells.h).
std::string join_cells(const std::vector<std::string>& cells) {
  std::string out;
  for (size_t i = 0; i < cells.size(); ++i) out += (i ? "," : "") + detail::csv_cell(cells[i]);
  return out;
}

// Columns sorted, "step" last.
std::vector<std::string> column_order(std::set<std::string> keys) {
  keys.erase("step");
  std::vector<std::string> cols(keys.begin(), keys.end());
  cols.push_back("step");
  return cols;
}

}  // namespace

CSVLogger::CSVLogger(CSVLoggerOptions options) : options_(std::move(options)) {
  if (options_.flush_logs_every_n_steps() < 1) {
    throw std::invalid_argument("CSVLogger: flush_logs_every_n_steps=" + std::to_string(options_.flush_logs_every_n_steps()) +
                                " must be >= 1");
  }
}

CSVLogger::CSVLogger(std::string root_dir, std::string name, std::optional<int64_t> version)
    : CSVLogger(CSVLoggerOptions(std::move(root_dir)).name(std::move(name)).version(version)) {}

std::string CSVLogger::version() {
  if (!options_.version()) options_.version(detail::next_version((fs::path(options_.root_dir()) / options_.name()).string()));
  return std::to_string(*options_.version());
}

std::string CSVLogger::log_dir() {
  return (fs::path(options_.root_dir()) / options_.name() / ("version_" + version())).string();
}

void CSVLogger::log_metrics(const std::map<std::string, double>& metrics, int64_t step) {
  auto row = detail::with_prefix(metrics, options_.prefix());
  row["step"] = static_cast<double>(step);
  rows_.push_back(std::move(row));
  if (step - written_step_ >= options_.flush_logs_every_n_steps()) save();
}

void CSVLogger::log_hyperparams(const c10::Dict<std::string, c10::IValue>& hparams) {
  detail::write_hparams_yaml(log_dir(), hparams);
}

void CSVLogger::save() {
  if (rows_.empty()) return;
  fs::create_directories(log_dir());
  const fs::path path = fs::path(log_dir()) / "metrics.csv";
  // What the file holds already: its header, and whether its last line is whole.
  std::vector<std::string> cols;
  bool whole_lines = true;
  std::error_code ec;
  if (fs::is_regular_file(path, ec) && fs::file_size(path, ec) > 0) {
    std::ifstream in(path, std::ios::binary);
    std::string header;
    std::getline(in, header);
    cols = detail::split_csv_line(header);
    in.clear();
    in.seekg(-1, std::ios::end);
    whole_lines = in.get() == '\n';
  }
  std::set<std::string> keys(cols.begin(), cols.end());
  bool widened = false;
  for (const auto& r : rows_)
    for (const auto& kv : r) widened = keys.insert(kv.first).second || widened;
  if (cols.empty()) {
    cols = column_order(keys);
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << join_cells(cols) << "\n";
    if (!out) throw std::runtime_error("CSVLogger: cannot write " + path.string());
  } else if (widened) {
    // A new column: rewrite the file with the wider header (to a temporary, then rename).
    std::vector<std::string> wider = column_order(keys);
    const fs::path tmp = fs::path(log_dir()) / ".metrics.csv.tmp";
    {
      std::ifstream in(path, std::ios::binary);
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      std::string line;
      std::getline(in, line);
      out << join_cells(wider) << "\n";
      while (std::getline(in, line)) {
        const auto cells = detail::split_csv_line(line);
        std::map<std::string, std::string> by_name;
        for (size_t i = 0; i < cells.size() && i < cols.size(); ++i) by_name[cols[i]] = cells[i];
        std::vector<std::string> row;
        for (const auto& c : wider) row.push_back(by_name.count(c) ? by_name[c] : "");
        out << join_cells(row) << "\n";
      }
      if (!out) throw std::runtime_error("CSVLogger: cannot write " + tmp.string());
    }
    fs::rename(tmp, path);
    cols = std::move(wider);
    whole_lines = true;
  }
  std::ofstream out(path, std::ios::binary | std::ios::app);
  out << std::setprecision(std::numeric_limits<double>::max_digits10);
  if (!whole_lines) out << "\n";  // a line cut by a killed writer stays a line of its own
  for (const auto& r : rows_) {
    for (size_t i = 0; i < cols.size(); ++i) {
      if (i) out << ",";
      auto it = r.find(cols[i]);
      if (it == r.end()) continue;
      if (cols[i] == "step" || cols[i] == "epoch") {
        out << static_cast<int64_t>(it->second);
      } else {
        out << it->second;
      }
    }
    out << "\n";
  }
  out.flush();
  if (!out) throw std::runtime_error("CSVLogger: cannot append to " + path.string());
  written_step_ = static_cast<int64_t>(rows_.back().at("step"));
  rows_.clear();
}

void CSVLogger::finalize(const std::string& /*status*/) { save(); }

}  // namespace fulgur
