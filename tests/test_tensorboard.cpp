// SPDX-License-Identifier: Apache-2.0
// TensorBoardLogger against TensorBoard itself (issue 14): its Python event
// reader and a real server on loopback, both from .venv/tensorboard (made by
// scripts/install-deps), read what the logger wrote; PyYAML reads the
// hparams.yaml that it and CSVLogger write.
#include "support.h"

#include "loggers/crc32c.h"

#include <fulgur/loggers/tensorboard_logger.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

namespace fs = std::filesystem;
using namespace fulgur;
using fulgur::testing::regression_data;
using fulgur::testing::TempDir;
using fulgur::testing::TinyRegression;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;

namespace {

// Runs `command`, bounded by `seconds` (coreutils timeout), and returns what it printed; the
// test fails on a non-zero exit.
std::string run(const std::string& command, int seconds) {
  const std::string full = "timeout -k 5 " + std::to_string(seconds) + " " + command + " 2>&1";
  FILE* p = ::popen(full.c_str(), "r");
  if (!p) {
    ADD_FAILURE() << "cannot run " << full;
    return "";
  }
  std::string out;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  const int status = ::pclose(p);
  EXPECT_EQ(status, 0) << full << " printed:\n" << out;
  return out;
}

std::string python() {
  const std::string py = std::string(FULGUR_TENSORBOARD_VENV) + "/bin/python";
  EXPECT_TRUE(fs::exists(py)) << py << " is missing: scripts/install-deps makes it";
  return py;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string script(const std::string& name) { return std::string(FULGUR_TEST_SCRIPTS) + "/" + name; }

// tag -> [(step, value)] from "scalar TAG STEP VALUE" lines.
using Series = std::map<std::string, std::vector<std::pair<int64_t, double>>>;
Series scalars_in(const std::string& text) {
  Series s;
  std::istringstream in(text);
  std::string word, tag;
  int64_t step;
  double value;
  for (std::string line; std::getline(in, line);) {
    std::istringstream l(line);
    if (l >> word && word == "scalar" && l >> tag >> step >> value) s[tag].push_back({step, value});
  }
  return s;
}

std::vector<std::string> lines_starting(const std::string& text, const std::string& first) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (line.rfind(first + " ", 0) == 0) out.push_back(line);
  return out;
}

std::vector<std::string> event_files(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0) out.push_back(e.path().string());
  return out;
}

// metrics.csv as tag -> [(step, value)], rows in file order, empty cells left out.
Series csv_series(const std::string& path) {
  std::ifstream in(path);
  std::string header;
  std::getline(in, header);
  std::vector<std::string> cols;
  std::stringstream hs(header);
  for (std::string c; std::getline(hs, c, ',');) cols.push_back(c);
  Series s;
  for (std::string line; std::getline(in, line);) {
    std::vector<std::string> cells;
    std::stringstream ls(line);
    for (std::string c; std::getline(ls, c, ',');) cells.push_back(c);
    cells.resize(cols.size());
    const int64_t step = std::stoll(cells.back());
    for (size_t i = 0; i + 1 < cols.size(); ++i)
      if (!cells[i].empty()) s[cols[i]].push_back({step, std::stod(cells[i])});
  }
  return s;
}

struct WithHparams : TinyRegression {
  WithHparams() {
    auto optim = make_dict();
    optim.insert("lr", 0.1);
    optim.insert("name", std::string("sgd"));
    auto h = make_dict();
    h.insert("batch_size", int64_t{8});
    h.insert("optim", optim);
    h.insert("shuffle", true);
    h.insert("unset", c10::IValue());
    save_hyperparameters(h);
  }
};

}  // namespace

TEST(TensorBoard, Crc32cGivesTheCheckValues) {
  // The check value of the CRC catalogue, and RFC 3720's 32 zero bytes and 32 0xFF bytes.
  EXPECT_EQ(fulgur::detail::crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(fulgur::detail::crc32c(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(fulgur::detail::crc32c(std::string(32, '\xFF')), 0x62A8AB43u);
  // Masked: crc32c("") is 0, so only the added constant remains.
  EXPECT_EQ(fulgur::detail::masked_crc32c(""), 0xa282ead8u);
}

TEST(TensorBoard, EventReaderLoadsEachScalarAndTheHparams) {
  TempDir dir;
  {
    TensorBoardLogger logger(TensorBoardLoggerOptions(dir.path).default_hp_metric(false));
    logger.log_metrics({{"a", 0.5}}, 3);
    logger.log_metrics({{"a", 1.5}, {"b", -2.0}}, 7);
    auto h = make_dict();
    h.insert("lr", 0.25);
    h.insert("name", std::string("adam"));
    logger.log_hyperparams(h);
    logger.finalize("success");
    // After finalize, a second file in the same folder; the reader reads both.
    logger.log_metrics({{"a", 4.0}}, 9);
    EXPECT_EQ(logger.log_dir(), dir.path + "/lightning_logs/version_0");
  }
  EXPECT_EQ(event_files(dir.path).size(), 2u);
  const std::string out = run(python() + " " + script("read_events.py") + " " + dir.path + "/lightning_logs/version_0", 120);
  const Series s = scalars_in(out);
  EXPECT_THAT(s, ElementsAre(Pair("a", ElementsAre(Pair(3, 0.5), Pair(7, 1.5), Pair(9, 4.0))),
                             Pair("b", ElementsAre(Pair(7, -2.0)))))
      << out;
  EXPECT_THAT(lines_starting(out, "hparam"), ElementsAre("hparam lr number_value 0.25", "hparam name string_value adam"));
  EXPECT_THAT(lines_starting(out, "hparam_info"),
              ElementsAre("hparam_info lr DATA_TYPE_FLOAT64", "hparam_info name DATA_TYPE_STRING"));
  EXPECT_TRUE(lines_starting(out, "metric_info").empty());  // default_hp_metric(false)
  EXPECT_THAT(lines_starting(out, "session_end"), ElementsAre("session_end STATUS_SUCCESS"));
}

TEST(TensorBoard, BesideACsvLoggerAFitLogsTheSameRowsInOneVersionFolder) {
  TempDir dir;
  WithHparams model;
  auto tb = std::make_shared<TensorBoardLogger>(dir.path);
  auto csv = std::make_shared<CSVLogger>(dir.path);
  Trainer trainer(TrainerOptions().accelerator("cpu").devices(1).default_root_dir(dir.path).enable_progress_bar(false)
                      .num_sanity_val_steps(0).max_epochs(3).log_every_n_steps(1).enable_model_summary(false)
                      .logger({tb, csv}));
  auto data = regression_data(32);
  trainer.fit(model, std::make_shared<DataLoader>(data, DataLoaderOptions(8)),
              std::make_shared<DataLoader>(data, DataLoaderOptions(16)));
  // Both resolved their version before either wrote: one folder, and checkpoints under the first.
  const std::string run_dir = dir.path + "/lightning_logs/version_0";
  EXPECT_EQ(trainer.log_dir(), run_dir);
  EXPECT_EQ(csv->log_dir(), run_dir);
  EXPECT_FALSE(fs::exists(dir.path + "/lightning_logs/version_1"));
  EXPECT_FALSE(trainer.checkpoint_callback()->best_model_path().empty());
  EXPECT_EQ(fs::path(trainer.checkpoint_callback()->best_model_path()).parent_path().string(), run_dir + "/checkpoints");

  const std::string out = run(python() + " " + script("read_events.py") + " " + run_dir, 120);
  Series tb_series = scalars_in(out);
  ASSERT_EQ(tb_series.count("hp_metric"), 1u) << out;
  EXPECT_THAT(tb_series["hp_metric"], ElementsAre(Pair(0, -1.0)));
  tb_series.erase("hp_metric");
  const Series from_csv = csv_series(run_dir + "/metrics.csv");
  // 4 batches x 3 epochs of train_loss, 3 of val_loss, epoch on each row.
  ASSERT_EQ(from_csv.at("train_loss").size(), 12u);
  ASSERT_EQ(from_csv.at("val_loss").size(), 3u);
  ASSERT_EQ(tb_series.size(), from_csv.size()) << out;
  for (const auto& [tag, points] : from_csv) {
    ASSERT_EQ(tb_series[tag].size(), points.size()) << tag;
    for (size_t i = 0; i < points.size(); ++i) {
      EXPECT_EQ(tb_series[tag][i].first, points[i].first) << tag << " #" << i;
      // TensorBoard's scalars are float32.
      EXPECT_NEAR(tb_series[tag][i].second, points[i].second, 1e-6 * std::max(1.0, std::abs(points[i].second)))
          << tag << " #" << i;
    }
  }
  EXPECT_THAT(lines_starting(out, "hparam"),
              ElementsAre("hparam batch_size number_value 8.0", "hparam optim/lr number_value 0.1",
                          "hparam optim/name string_value sgd", "hparam shuffle bool_value True"));
  EXPECT_THAT(lines_starting(out, "metric_info"), ElementsAre("metric_info hp_metric"));
  // hparams.yaml, as Lightning's two loggers write it in the version folder (both wrote this one).
  EXPECT_EQ(read_file(run_dir + "/hparams.yaml"),
            "batch_size: 8\n"
            "optim:\n"
            "  lr: 0.1\n"
            "  name: sgd\n"
            "shuffle: true\n"
            "unset: null\n");
}

// hparams.yaml read back by PyYAML (Debian's python3-yaml): every kind of
// value, and the strings and floats a careless writer would get wrong.
TEST(HparamsYaml, PyYamlReadsBackWhatEitherLoggerWrites) {
  auto nested = make_dict();
  nested.insert("empty", make_dict());
  nested.insert("depth", int64_t{2});
  c10::impl::GenericList layers(c10::AnyType::get());
  layers.push_back(int64_t{64});
  layers.push_back(std::string("relu"));
  auto block = make_dict();
  block.insert("width", int64_t{32});
  layers.push_back(block);
  c10::impl::GenericList pair(c10::AnyType::get());
  pair.push_back(0.5);
  pair.push_back(false);
  layers.push_back(pair);
  auto h = make_dict();
  h.insert("lr", 1e-5);  // "1e-05" is a string to PyYAML
  h.insert("whole", 3.0);
  h.insert("big", 1e300);
  h.insert("negative", int64_t{-7});
  h.insert("inf", std::numeric_limits<double>::infinity());
  h.insert("word_yes", std::string("yes"));
  h.insert("word_null", std::string("null"));
  h.insert("digits", std::string("0123"));
  h.insert("tricky", std::string("a: \"b\" # c\\d\n\te"));
  h.insert("accent", std::string("caf\xc3\xa9"));
  h.insert("empty_string", std::string());
  h.insert("key with: colon", std::string("path/to-x.y_z"));
  h.insert("nested", nested);
  h.insert("layers", layers);
  h.insert("none", c10::IValue());
  h.insert("empty_list", c10::impl::GenericList(c10::AnyType::get()));
  h.insert("tuple", c10::ivalue::Tuple::create({int64_t{1}, std::string("x")}));
  const std::string expected =
      "{\"accent\": \"caf\\u00e9\", \"big\": 1e+300, \"digits\": \"0123\", \"empty_list\": [], "
      "\"empty_string\": \"\", \"inf\": Infinity, \"key with: colon\": \"path/to-x.y_z\", "
      "\"layers\": [64, \"relu\", {\"width\": 32}, [0.5, false]], \"lr\": 1e-05, \"negative\": -7, "
      "\"nested\": {\"depth\": 2, \"empty\": {}}, \"none\": null, "
      "\"tricky\": \"a: \\\"b\\\" # c\\\\d\\n\\te\", \"tuple\": [1, \"x\"], \"whole\": 3.0, \"word_null\": \"null\", "
      "\"word_yes\": \"yes\"}\n";
  const std::string load =
      std::string(FULGUR_SYSTEM_PYTHON) +
      " -c 'import json, sys, yaml; print(json.dumps(yaml.safe_load(open(sys.argv[1], encoding=\"utf-8\")), sort_keys=True))' ";
  TempDir dir;
  CSVLogger csv(dir.path, "csv");
  csv.log_hyperparams(h);
  EXPECT_EQ(run(load + csv.log_dir() + "/hparams.yaml", 60), expected) << read_file(csv.log_dir() + "/hparams.yaml");
  TensorBoardLogger tb(dir.path, "tb");
  tb.log_hyperparams(h);
  EXPECT_EQ(run(load + tb.log_dir() + "/hparams.yaml", 60), expected) << read_file(tb.log_dir() + "/hparams.yaml");
  // No hparams: an empty mapping.
  CSVLogger none(dir.path, "none");
  none.log_hyperparams(make_dict());
  EXPECT_EQ(read_file(none.log_dir() + "/hparams.yaml"), "{}\n");
}

TEST(TensorBoard, PrefixGoesBeforeEveryMetricNameInBothLoggers) {
  TempDir dir;
  {
    TensorBoardLogger tb(TensorBoardLoggerOptions(dir.path).name("tb").prefix("train").default_hp_metric(false));
    tb.log_metrics({{"loss", 0.5}, {"epoch", 0.0}}, 2);
    CSVLogger csv(CSVLoggerOptions(dir.path).name("csv").prefix("train"));
    csv.log_metrics({{"loss", 0.5}, {"epoch", 0.0}}, 2);
    csv.save();
  }
  const std::string out = run(python() + " " + script("read_events.py") + " " + dir.path + "/tb/version_0", 120);
  EXPECT_THAT(scalars_in(out), ElementsAre(Pair("train-epoch", ElementsAre(Pair(2, 0.0))),
                                           Pair("train-loss", ElementsAre(Pair(2, 0.5)))))
      << out;
  EXPECT_EQ(read_file(dir.path + "/csv/version_0/metrics.csv"), "train-epoch,train-loss,step\n0,0.5,2\n");
}

TEST(TensorBoard, ServerOnLoopbackServesTheScalars) {
  TempDir dir;
  {
    TensorBoardLogger logger(dir.path);
    for (int64_t step = 1; step <= 5; ++step) logger.log_metrics({{"loss", 1.0 / step}, {"epoch", 0.0}}, step);
  }
  const std::string out = run(python() + " " + script("serve_scalars.py") + " " + dir.path +
                                  " lightning_logs/version_0 loss epoch",
                              150);
  EXPECT_THAT(lines_starting(out, "run"), ElementsAre("run lightning_logs/version_0"));
  const Series s = scalars_in(out);
  ASSERT_EQ(s.count("loss"), 1u) << out;
  ASSERT_EQ(s.at("loss").size(), 5u) << out;
  for (int64_t step = 1; step <= 5; ++step) {
    EXPECT_EQ(s.at("loss")[step - 1].first, step);
    EXPECT_NEAR(s.at("loss")[step - 1].second, 1.0 / step, 1e-7);
  }
  EXPECT_EQ(s.at("epoch").size(), 5u);
  // The server was stopped: nothing it started is left.
  EXPECT_TRUE(fulgur::testing::processes_matching("tensorboard.main").empty());
}

TEST(TensorBoard, OnlyRankZeroWritesUnderDdp) {
  TempDir dir;
  TinyRegression model;
  auto tb = std::make_shared<TensorBoardLogger>(dir.path);
  Trainer trainer(TrainerOptions().accelerator("cpu").devices(2).strategy("ddp").default_root_dir(dir.path)
                      .enable_progress_bar(false).num_sanity_val_steps(0).max_steps(4).log_every_n_steps(1)
                      .enable_checkpointing(false).enable_model_summary(false).logger(tb));
  trainer.fit(model, std::make_shared<DataLoader>(regression_data(32), DataLoaderOptions(4)));
  // The launching process learnt rank 0's version.
  EXPECT_EQ(tb->log_dir(), dir.path + "/lightning_logs/version_0");
  const auto files = event_files(dir.path);
  ASSERT_EQ(files.size(), 1u);
  const std::string out = run(python() + " " + script("read_events.py") + " " + tb->log_dir(), 120);
  const Series s = scalars_in(out);
  ASSERT_EQ(s.count("train_loss"), 1u) << out;
  std::vector<int64_t> steps;
  for (const auto& p : s.at("train_loss")) steps.push_back(p.first);
  EXPECT_THAT(steps, ElementsAre(1, 2, 3, 4));
}

TEST(TensorBoard, AnUnwritableFolderIsNamed) {
  TempDir dir;
  std::ofstream(dir.path + "/file") << "not a folder";
  TensorBoardLogger logger(dir.path + "/file");
  try {
    logger.log_metrics({{"a", 1.0}}, 1);
    FAIL() << "no error";
  } catch (const std::exception& e) {
    EXPECT_THAT(e.what(), HasSubstr(dir.path + "/file"));
  }
}

// A string is not a logger choice: it would otherwise convert to `true`.
static_assert(!std::is_constructible_v<LoggerChoice, const char*>);

// One `logger` field takes what Lightning's logger= takes: true, false, a
// logger, or several (an empty list is none).
// Nothing chosen: TensorBoard's reader and the CSV both see the fit's rows, in one version folder.
TEST(TensorBoard, ByDefaultAFitWritesEventsAndCsvInOneVersionFolder) {
  TempDir dir;
  WithHparams model;
  Trainer trainer(TrainerOptions().accelerator("cpu").devices(1).default_root_dir(dir.path).enable_progress_bar(false)
                      .num_sanity_val_steps(0).max_epochs(2).log_every_n_steps(1).enable_model_summary(false));
  auto data = regression_data(32);
  trainer.fit(model, std::make_shared<DataLoader>(data, DataLoaderOptions(8)));
  const std::string run_dir = dir.path + "/lightning_logs/version_0";
  EXPECT_EQ(trainer.log_dir(), run_dir);
  EXPECT_FALSE(fs::exists(dir.path + "/lightning_logs/version_1"));
  const Series from_csv = csv_series(run_dir + "/metrics.csv");
  ASSERT_EQ(from_csv.at("train_loss").size(), 8u);
  Series tb_series = scalars_in(run(python() + " " + script("read_events.py") + " " + run_dir, 120));
  ASSERT_EQ(tb_series["train_loss"].size(), 8u);
  for (size_t i = 0; i < 8; ++i) {
    EXPECT_EQ(tb_series["train_loss"][i].first, from_csv.at("train_loss")[i].first) << i;
  }
}

TEST(TensorBoard, LoggerTakesABoolALoggerOrSeveral) {
  TempDir dir;
  auto quiet = [&] { return TrainerOptions().default_root_dir(dir.path).enable_progress_bar(false); };
  Trainer with_default(quiet());
  ASSERT_EQ(with_default.loggers().size(), 2u);
  EXPECT_NE(dynamic_cast<TensorBoardLogger*>(with_default.loggers()[0].get()), nullptr);
  EXPECT_NE(dynamic_cast<CSVLogger*>(with_default.loggers()[1].get()), nullptr);
  EXPECT_TRUE(Trainer(quiet().logger(false)).loggers().empty());
  EXPECT_TRUE(Trainer(quiet().logger(std::vector<std::shared_ptr<Logger>>{})).loggers().empty());
  auto tb = std::make_shared<TensorBoardLogger>(dir.path);
  auto csv = std::make_shared<CSVLogger>(dir.path);
  Trainer one(quiet().logger(tb));
  ASSERT_EQ(one.loggers().size(), 1u);
  EXPECT_EQ(one.logger().get(), tb.get());
  Trainer two(quiet().logger({tb, csv}));
  ASSERT_EQ(two.loggers().size(), 2u);
  EXPECT_EQ(two.loggers()[0].get(), tb.get());
  EXPECT_EQ(two.loggers()[1].get(), csv.get());
}

TEST(TensorBoard, NullLoggerIsRefusedNamingItsPlace) {
  TempDir dir;
  try {
    Trainer t(TrainerOptions().default_root_dir(dir.path).logger(std::shared_ptr<CSVLogger>()));
    FAIL() << "a null logger was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("logger: logger 0 of the 1 given is null"));
  }
  try {
    Trainer t(TrainerOptions().default_root_dir(dir.path).logger({std::make_shared<CSVLogger>(dir.path), nullptr}));
    FAIL() << "a null logger among two was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("logger 1 of the 2 given is null"));
    EXPECT_THAT(e.what(), HasSubstr("true (a TensorBoardLogger and a CSVLogger in default_root_dir) or false (none)"));
  }
}
