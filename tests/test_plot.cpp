// SPDX-License-Identifier: Apache-2.0
// fulgur-plot (issue 14) on the metrics.csv of a real fit: the series it says
// it drew are the run's columns, and the file it wrote is a PNG of the size asked.
#include "support.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>

using namespace fulgur;
using fulgur::testing::regression_data;
using fulgur::testing::TempDir;
using fulgur::testing::TinyRegression;
using ::testing::HasSubstr;

namespace {

std::string run(const std::string& command, int* status) {
  FILE* p = ::popen((command + " 2>&1").c_str(), "r");
  std::string out;
  char buf[4096];
  for (size_t n; p && (n = fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  *status = p ? ::pclose(p) : -1;
  return out;
}

uint32_t big_endian(const std::string& s, size_t at) {
  uint32_t v = 0;
  for (size_t i = 0; i < 4; ++i) v = (v << 8) | static_cast<unsigned char>(s[at + i]);
  return v;
}

// Column -> non-empty cells, from metrics.csv.
std::map<std::string, int> filled_cells(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  std::vector<std::string> cols;
  std::stringstream hs(line);
  for (std::string c; std::getline(hs, c, ',');) cols.push_back(c);
  std::map<std::string, int> n;
  while (std::getline(in, line)) {
    std::stringstream ls(line);
    size_t i = 0;
    for (std::string c; std::getline(ls, c, ','); ++i)
      if (!c.empty()) ++n[cols.at(i)];
  }
  return n;
}

}  // namespace

TEST(Plot, DrawsEachColumnOfARunIntoAPngOfTheAskedSize) {
  TempDir dir;
  TinyRegression model;
  Trainer trainer(TrainerOptions().accelerator("cpu").devices(1).default_root_dir(dir.path).enable_progress_bar(false)
                      .num_sanity_val_steps(0).max_epochs(4).log_every_n_steps(1).enable_checkpointing(false)
                      .enable_model_summary(false));
  auto data = regression_data(32);
  trainer.fit(model, std::make_shared<DataLoader>(data, DataLoaderOptions(8)),
              std::make_shared<DataLoader>(data, DataLoaderOptions(16)));
  const std::string csv = trainer.log_dir() + "/metrics.csv";
  auto cells = filled_cells(csv);
  ASSERT_EQ(cells.at("train_loss"), 16);  // 4 batches x 4 epochs
  ASSERT_EQ(cells.at("val_loss"), 4);
  cells.erase("step");
  cells.erase("epoch");

  int status = 0;
  const std::string png = dir.path + "/curves.png";
  const std::string out =
      run(fulgur::testing::program("fulgur-plot") + " " + trainer.log_dir() + " -o " + png + " --size 640x480", &status);
  ASSERT_EQ(status, 0) << out;
  std::map<std::string, int> drawn;
  const std::regex line(R"(fulgur-plot: drew (\S+) \((\d+) points?\) in panel (\S+))");
  for (std::sregex_iterator it(out.begin(), out.end(), line), end; it != end; ++it) {
    drawn[(*it)[1]] = std::stoi((*it)[2]);
    EXPECT_EQ((*it)[3], "loss") << "train_loss and val_loss share the panel 'loss'";
  }
  EXPECT_EQ(drawn, cells) << out;
  EXPECT_THAT(out, HasSubstr("fulgur-plot: wrote " + png + " (640x480)"));

  const std::string bytes = fulgur::testing::read_file(png);
  ASSERT_GT(bytes.size(), 24u);
  EXPECT_EQ(bytes.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  EXPECT_EQ(bytes.substr(12, 4), "IHDR");
  EXPECT_EQ(big_endian(bytes, 16), 640u);
  EXPECT_EQ(big_endian(bytes, 20), 480u);
}

TEST(Plot, AFileWithoutAStepColumnIsNamed) {
  TempDir dir;
  std::ofstream(dir.path + "/metrics.csv") << "loss,epoch\n1.0,0\n";
  int status = 0;
  const std::string out = run(fulgur::testing::program("fulgur-plot") + " " + dir.path, &status);
  EXPECT_NE(status, 0);
  EXPECT_THAT(out, HasSubstr(dir.path + "/metrics.csv\" has no step column"));
}

// Plotting someone else's metrics.csv runs nothing: column names and the run's folder with
// gnuplot's `backquotes`, quotes and a system() call are drawn as text, and a cell that is not a
// number (a data line "EOD" would end gnuplot's inline data, and the next line would run as a
// command) makes it refuse the file, naming the cell.
TEST(Plot, NamesAndCellsOfAHostileFileRunNothing) {
  TempDir dir;
  const std::string marker = dir.path + "/ran";
  const std::string folder = dir.path + "/run`touch " + marker + "1`\"'";
  std::filesystem::create_directories(folder);
  std::ofstream(folder + "/metrics.csv")
      << "step,loss`touch " << marker << "2`,\"acc\" . system(\"touch " << marker << "3\"),x'; system('touch " << marker
      << "4'); '\n"
      << "1,0.5,0.1,1\n2,0.4,0.2,2\n";
  int status = 0;
  std::string quoted_folder = "'";  // for sh: ' becomes '\''
  for (char c : folder) quoted_folder += c == '\'' ? std::string("'\\''") : std::string(1, c);
  std::string out = run(fulgur::testing::program("fulgur-plot") + " " + quoted_folder + "'", &status);
  EXPECT_EQ(status, 0) << out;
  EXPECT_THAT(out, HasSubstr("fulgur-plot: drew loss`touch " + marker + "2` (2 points)"));
  EXPECT_TRUE(std::filesystem::exists(folder + "/metrics.png")) << out;

  for (const std::string cell : {std::string("EOD"), "1; system('touch " + marker + "5')", "`touch " + marker + "6`", std::string("nan")}) {
    SCOPED_TRACE(cell);
    std::ofstream(dir.path + "/metrics.csv") << "step,loss\n1,0.5\n2," << cell << "\nplot system('touch " << marker
                                            << "7')\n3,0.3\n";
    out = run(fulgur::testing::program("fulgur-plot") + " " + dir.path, &status);
    EXPECT_NE(status, 0) << out;
    EXPECT_THAT(out, HasSubstr("line 3, column 'loss': '" + cell + "' is not a finite number"));
  }
  for (int i = 1; i <= 7; ++i) EXPECT_FALSE(std::filesystem::exists(marker + std::to_string(i))) << "ran command " << i;
}
