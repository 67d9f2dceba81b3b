// SPDX-License-Identifier: Apache-2.0
// fulgur-plot: a run's metrics.csv (CSVLogger) as a PNG of its curves, drawn
// by gnuplot. Every column but step and epoch is a series, plotted against
// step; series that differ only by a train/val/test prefix or a _step/_epoch
// suffix share a panel (train_loss, train_loss_epoch and val_loss: "loss").
//
// Example:
//   fulgur-plot runs/lightning_logs/version_0            # writes .../metrics.png
//   fulgur-plot runs/lightning_logs/version_0/metrics.csv -o curves.png --size 1200x800
//
// Prints each series it drew with its point count, then the PNG's path.
#include <CLI/CLI.hpp>
#include <fulgur/version.h>

#include "loggers/csv_cells.h"

#include <sys/wait.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

// The panel a series goes to: its name without train_/val_/test_ and _step/_epoch.
std::string panel_of(std::string name) {
  for (const char* prefix : {"train_", "val_", "test_"}) {
    if (name.rfind(prefix, 0) == 0) {
      name = name.substr(std::char_traits<char>::length(prefix));
      break;
    }
  }
  for (const std::string suffix : {"_step", "_epoch"}) {
    if (name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
      name.resize(name.size() - suffix.size());
      break;
    }
  }
  return name;
}

// A gnuplot string that is only text, whatever `s` holds: single quotes, where gnuplot expands
// no `backquoted` command and no escape, a quote doubled, and control characters (a newline
// would end the command) shown as '?'. A column name or a folder from someone else's
// metrics.csv must not run anything. (Not named `quoted`: for a non-const std::string, ADL
// would pick std::quoted, which double-quotes, and gnuplot expands backquotes there.)
std::string gnuplot_string(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') out += "''";
    else if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) out += '?';
    else out += c;
  }
  return out + "'";
}

// The cell as a number written by us (so nothing of the file's text reaches gnuplot's data
// blocks, where a line "EOD" would end the block and the next line run as a command), or
// nullopt if the cell is not a number.
std::optional<std::string> number(const std::string& cell) {
  const char* begin = cell.c_str();
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(begin, &end);
  if (cell.empty() || end != begin + cell.size() || !std::isfinite(v)) return std::nullopt;
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return std::string(buf);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Plots a fulgur run's metrics.csv (training and validation curves) into a PNG with gnuplot"};
  app.option_defaults()->always_capture_default();  // --help shows each default
  std::string input, output, size = "1000x700";
  app.add_option("run", input, "A run's folder (<root>/lightning_logs/version_N) or its metrics.csv")->required();
  app.add_option("-o,--output", output, "The PNG to write (default: metrics.png beside metrics.csv)");
  app.add_option("--size", size, "WIDTHxHEIGHT in pixels")->capture_default_str();
  app.set_version_flag("--version", "fulgur-plot (fulgur " + fulgur::version() + ")");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version exit 0; a usage error prints CLI11's message (it names the option)
    // and exits 2, as argparse and getopt programs do.
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }

  const fs::path csv = fs::is_directory(input) ? fs::path(input) / "metrics.csv" : fs::path(input);
  if (output.empty()) output = (csv.parent_path() / "metrics.png").string();
  int width = 0, height = 0;
  char x = 0;
  std::istringstream size_text(size);
  size_text >> width >> x >> height;
  if (x != 'x' || width < 100 || height < 100) {
    std::cerr << "fulgur-plot: --size '" << size << "' is not WIDTHxHEIGHT with both at least 100 (e.g. 1000x700)\n";
    return 2;
  }
  std::ifstream in(csv);
  std::string header;
  if (!in || !std::getline(in, header)) {
    std::cerr << "fulgur-plot: cannot read " << csv << " (give a run's folder or its metrics.csv, as CSVLogger writes)\n";
    return 1;
  }
  const auto cols = fulgur::detail::split_csv_line(header);
  int step_col = -1;
  for (size_t i = 0; i < cols.size(); ++i)
    if (cols[i] == "step") step_col = static_cast<int>(i);
  if (step_col < 0) {
    std::cerr << "fulgur-plot: " << csv << " has no step column (header: " << header << ")\n";
    return 1;
  }
  // Column -> "step value" lines, in file order.
  std::map<std::string, std::vector<std::string>> points;
  int row = 1;
  for (std::string line; std::getline(in, line);) {
    ++row;
    const auto cells = fulgur::detail::split_csv_line(line);
    if (static_cast<int>(cells.size()) <= step_col || cells[step_col].empty()) continue;
    for (size_t i = 0; i < cols.size() && i < cells.size(); ++i) {
      if (cols[i] == "epoch" || cells[i].empty()) continue;
      if (!number(cells[i])) {
        std::cerr << "fulgur-plot: " << csv << ", line " << row << ", column '" << cols[i] << "': '" << cells[i]
                  << "' is not a finite number (CSVLogger writes numbers only)\n";
        return 1;
      }
      if (cols[i] != "step") points[cols[i]].push_back(*number(cells[step_col]) + " " + *number(cells[i]));
    }
  }
  std::map<std::string, std::vector<std::string>> panels;  // panel -> its series
  for (const auto& [name, p] : points) panels[panel_of(name)].push_back(name);
  if (panels.empty()) {
    std::cerr << "fulgur-plot: " << csv << " has no values besides step and epoch\n";
    return 1;
  }

  std::ostringstream script;
  script << "set terminal pngcairo size " << width << "," << height << " font ',10'\n"
         << "set termoption noenhanced\n"
         << "set output " << gnuplot_string(output) << "\n";
  int block = 0;
  std::map<std::string, std::string> block_of;
  for (const auto& [name, p] : points) {
    block_of[name] = "$s" + std::to_string(block++);
    script << block_of[name] << " << EOD\n";
    for (const auto& line : p) script << line << "\n";
    script << "EOD\n";
  }
  script << "set multiplot layout " << panels.size() << ",1 title " << gnuplot_string(csv.parent_path().string()) << "\n"
         << "set grid\nset key outside right\nset xlabel 'step'\n";
  for (const auto& [panel, series] : panels) {
    script << "set title " << gnuplot_string(panel) << "\nplot ";
    for (size_t i = 0; i < series.size(); ++i) {
      const bool one_point = points[series[i]].size() == 1;
      script << (i ? ", " : "") << block_of[series[i]] << " using 1:2 with " << (one_point ? "points pointtype 7 pointsize 1.5" : "linespoints")
             << " title " << gnuplot_string(series[i]);
    }
    script << "\n";
  }
  script << "unset multiplot\n";

  FILE* gp = ::popen("gnuplot", "w");
  if (!gp) {
    std::cerr << "fulgur-plot: cannot start gnuplot (scripts/install-deps installs gnuplot-nox)\n";
    return 1;
  }
  const std::string text = script.str();
  std::fwrite(text.data(), 1, text.size(), gp);
  const int status = ::pclose(gp);
  if (status != 0 || !fs::exists(output)) {
    std::cerr << "fulgur-plot: gnuplot failed (status " << (WIFEXITED(status) ? WEXITSTATUS(status) : status)
              << ") writing " << output << "; is gnuplot (gnuplot-nox) installed?\n";
    return 1;
  }
  for (const auto& [panel, series] : panels)
    for (const auto& name : series)
      std::cout << "fulgur-plot: drew " << name << " (" << points[name].size()
                << (points[name].size() == 1 ? " point" : " points") << ") in panel " << panel << "\n";
  std::cout << "fulgur-plot: wrote " << output << " (" << width << "x" << height << ")\n";
  return 0;
}
