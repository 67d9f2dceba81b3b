// SPDX-License-Identifier: Apache-2.0
#include "support.h"

#include "optim/fused_adam.h"
#include "runtime/memory.h"

#include <gtest/gtest.h>

#include <malloc.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <set>
#include <fstream>
#include <functional>
#include <sstream>
#include <thread>

using namespace fulgur;
using fulgur::testing::regression_data;
using fulgur::testing::TempDir;
using fulgur::testing::TinyRegression;

namespace fs = std::filesystem;

namespace {

TrainerOptions quiet(const std::string& root) {
  return TrainerOptions()
      .accelerator("cpu")
      .devices(1)
      .default_root_dir(root)
      .enable_progress_bar(false)
      .num_sanity_val_steps(0);
}

std::shared_ptr<DataLoader> loader(int64_t n, int64_t batch, bool shuffle = false) {
  return std::make_shared<DataLoader>(regression_data(n), DataLoaderOptions(batch).shuffle(shuffle).seed(3));
}

std::string read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

TEST(Loops, EpochsStepsAndLimits) {
  TempDir dir;
  TinyRegression m;
  Trainer t(quiet(dir.path).max_epochs(3).limit_train_batches(4).enable_checkpointing(false));
  t.fit(m, loader(80, 8));
  EXPECT_EQ(t.global_step(), 12);
  EXPECT_EQ(t.current_epoch(), 3);
  EXPECT_EQ(m.losses.size(), 12u);

  TinyRegression m2;
  Trainer t2(quiet(dir.path).max_epochs(-1).max_steps(7).enable_checkpointing(false));
  t2.fit(m2, loader(80, 8));
  EXPECT_EQ(t2.global_step(), 7);
  EXPECT_EQ(t2.current_epoch(), 0);

  TinyRegression m3;
  Trainer t3(quiet(dir.path).max_epochs(1).limit_train_batches(0.5).enable_checkpointing(false));
  t3.fit(m3, loader(80, 8));
  EXPECT_EQ(t3.global_step(), 5);
}

TEST(Loops, LossFallsOnALinearProblem) {
  TempDir dir;
  TinyRegression m(0.05);
  Trainer t(quiet(dir.path).max_epochs(5).enable_checkpointing(false));
  t.fit(m, loader(256, 16, true));
  EXPECT_LT(m.losses.back(), 0.2 * m.losses.front());
}

// Counts how often validation ran.
struct CountingModule : TinyRegression {
  StepOutput validation_step(const Batch& b, int64_t i) override {
    ++val_batches;
    return TinyRegression::validation_step(b, i);
  }
  void on_validation_epoch_end() override { ++val_runs; }
  torch::Tensor predict_step(const Batch& b, int64_t) override { return forward(b.data); }
  int val_batches = 0;
  int val_runs = 0;
};

TEST(Loops, ValidationIntervalAndSanityCheck) {
  TempDir dir;
  CountingModule m;
  Trainer t(quiet(dir.path).max_epochs(2).val_check_interval(int64_t(5)).limit_val_batches(2).num_sanity_val_steps(1)
                .enable_checkpointing(false));
  t.fit(m, loader(80, 8), loader(40, 8));
  // 10 batches an epoch, validation every 5: 2 per epoch, plus one sanity run of 1 batch.
  EXPECT_EQ(m.val_runs, 5);
  EXPECT_EQ(m.val_batches, 1 + 4 * 2);

  CountingModule m2;
  Trainer t2(quiet(dir.path).max_epochs(4).check_val_every_n_epoch(2).enable_checkpointing(false));
  t2.fit(m2, loader(16, 8), loader(16, 8));
  EXPECT_EQ(m2.val_runs, 2);
}

// fast_dev_run(n): n batches of every loop, one epoch, no sanity check, no
// logger and no checkpoint (Lightning's fast_dev_run=n).
TEST(Loops, FastDevRunRunsThatManyBatchesOfEveryLoop) {
  TempDir dir;
  CountingModule m;
  Trainer t(quiet(dir.path).max_epochs(5).fast_dev_run(3).num_sanity_val_steps(2));
  t.fit(m, loader(80, 8), loader(40, 8));
  EXPECT_EQ(t.global_step(), 3);
  EXPECT_EQ(t.current_epoch(), 1);
  EXPECT_EQ(m.val_runs, 1);
  EXPECT_EQ(m.val_batches, 3);
  EXPECT_TRUE(t.loggers().empty());
  EXPECT_TRUE(std::filesystem::is_empty(dir.path)) << "fast_dev_run wrote into " << dir.path;

  CountingModule m2;
  Trainer t2(quiet(dir.path).fast_dev_run(2));
  t2.validate(m2, loader(40, 8));
  EXPECT_EQ(m2.val_batches, 2);
  Trainer t3(quiet(dir.path).fast_dev_run(2));
  EXPECT_EQ(t3.predict(m2, loader(40, 8)).size(), 2u);
  // More batches asked for than the loader has: all of them.
  CountingModule m4;
  Trainer t4(quiet(dir.path).fast_dev_run(50));
  t4.validate(m4, loader(40, 8));
  EXPECT_EQ(m4.val_batches, 5);
}

TEST(Loops, AccumulationEqualsALargerBatch) {
  TempDir dir;
  torch::manual_seed(0);
  TinyRegression a;
  torch::manual_seed(0);
  TinyRegression b;
  ASSERT_TRUE(torch::equal(a.fc->weight, b.fc->weight));
  Trainer ta(quiet(dir.path).max_epochs(1).accumulate_grad_batches(2).enable_checkpointing(false));
  ta.fit(a, loader(32, 4));
  Trainer tb(quiet(dir.path).max_epochs(1).enable_checkpointing(false));
  tb.fit(b, loader(32, 8));
  EXPECT_EQ(ta.global_step(), 4);
  EXPECT_EQ(tb.global_step(), 4);
  EXPECT_TRUE(torch::allclose(a.fc->weight, b.fc->weight, 1e-5, 1e-6));
  EXPECT_TRUE(torch::allclose(a.fc->bias, b.fc->bias, 1e-5, 1e-6));
}

// Records the gradient norm the optimizer sees.
struct GradProbe : TinyRegression {
  GradProbe() : TinyRegression(1e-9) {}
  StepOutput training_step(const Batch& b, int64_t i) override {
    return (TinyRegression::training_step(b, i).loss() * 1000.0);
  }
  OptimizerConfig configure_optimizers() override { return std::make_shared<Probe>(parameters(), this); }
  struct Probe : torch::optim::SGD {
    Probe(std::vector<torch::Tensor> p, GradProbe* o) : torch::optim::SGD(p, torch::optim::SGDOptions(0.0)), owner(o) {}
    torch::Tensor step(LossClosure c) override {
      double sq = 0, mx = 0;
      for (auto& g : param_groups())
        for (auto& p : g.params()) {
          sq += p.grad().pow(2).sum().item<double>();
          mx = std::max(mx, p.grad().abs().max().item<double>());
        }
      owner->norms.push_back(std::sqrt(sq));
      owner->maxes.push_back(mx);
      return torch::optim::SGD::step(c);
    }
    GradProbe* owner;
  };
  std::vector<double> norms, maxes;
};

TEST(Loops, GradientClippingByNormAndValue) {
  TempDir dir;
  GradProbe n;
  Trainer tn(quiet(dir.path).max_steps(3).gradient_clip_val(0.5).enable_checkpointing(false));
  tn.fit(n, loader(64, 8));
  for (double v : n.norms) EXPECT_NEAR(v, 0.5, 1e-3);
  GradProbe v;
  Trainer tv(quiet(dir.path).max_steps(3).gradient_clip_val(0.25).gradient_clip_algorithm("value").enable_checkpointing(false));
  tv.fit(v, loader(64, 8));
  for (double m : v.maxes) EXPECT_LE(m, 0.25 + 1e-7);
}

struct NoLoss : TinyRegression {
  StepOutput training_step(const Batch&, int64_t) override { return {}; }
};

TEST(Loops, TrainingStepWithoutLossIsAnError) {
  TempDir dir;
  NoLoss m;
  Trainer t(quiet(dir.path).max_steps(1).enable_checkpointing(false));
  try {
    t.fit(m, loader(16, 8));
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("training_step returned nothing"), std::string::npos) << e.what();
  }
}

struct Manual : TinyRegression {
  Manual() { set_automatic_optimization(false); }
  StepOutput training_step(const Batch& b, int64_t) override {
    auto opt = optimizers().at(0);
    opt.zero_grad();
    auto loss = torch::mse_loss(forward(b.data), b.target);
    manual_backward(loss);
    opt.step();
    ++steps;
    return {};
  }
  int steps = 0;
};

TEST(Loops, ManualOptimization) {
  TempDir dir;
  Manual m;
  auto before = m.fc->weight.clone();
  Trainer t(quiet(dir.path).max_epochs(1).enable_checkpointing(false));
  t.fit(m, loader(32, 8));
  EXPECT_EQ(m.steps, 4);
  EXPECT_EQ(t.global_step(), 4);
  EXPECT_FALSE(torch::equal(before, m.fc->weight));
}

// Logs known values so the aggregates can be checked by hand.
struct Logs : TinyRegression {
  StepOutput training_step(const Batch& b, int64_t i) override {
    log("k", static_cast<double>(i), LogOptions().on_step(true).on_epoch(true));
    log("kmax", static_cast<double>(i), LogOptions().on_step(false).on_epoch(true).reduce_fx("max"));
    return TinyRegression::training_step(b, i);
  }
};

TEST(Logging, StepAndEpochValuesAndMetricsCsv) {
  TempDir dir;
  Logs m;
  Trainer t(quiet(dir.path).max_epochs(1).log_every_n_steps(2).enable_checkpointing(false));
  t.fit(m, loader(32, 8));
  const auto& cm = t.callback_metrics();
  // Batches 0..3, equal sizes: mean 1.5, max 3; the last step value is 3.
  EXPECT_DOUBLE_EQ(cm.at("k_epoch"), 1.5);
  EXPECT_DOUBLE_EQ(cm.at("k"), 1.5);
  EXPECT_DOUBLE_EQ(cm.at("kmax"), 3.0);
  EXPECT_DOUBLE_EQ(cm.at("k_step"), 3.0);
  const std::string csv = read(dir.path + "/lightning_logs/version_0/metrics.csv");
  std::istringstream lines(csv);
  std::string header;
  std::getline(lines, header);
  EXPECT_EQ(header, "epoch,k_epoch,k_step,kmax,train_loss,step");
  int rows = 0;
  for (std::string line; std::getline(lines, line);) ++rows;
  EXPECT_EQ(rows, 3);  // steps 2 and 4, plus the epoch row
  EXPECT_TRUE(fs::exists(dir.path + "/lightning_logs/version_0/hparams.yaml"));
  // A second run takes the next version.
  Logs m2;
  Trainer t2(quiet(dir.path).max_epochs(1).enable_checkpointing(false));
  t2.fit(m2, loader(16, 8));
  EXPECT_TRUE(fs::exists(dir.path + "/lightning_logs/version_1/metrics.csv"));
}

// Issue 32, B8: metric names with ',' or '"' are quoted as RFC 4180 (Python's csv module,
// pandas) writes them, in the header and through the rewrite that widens it; Python's csv module
// reads the columns back. A name with a line break is refused at log().
TEST(Logging, CsvLoggerQuotesNamesPythonsCsvModuleReadsThemBack) {
  TempDir dir;
  const std::string csv = dir.path + "/lightning_logs/version_0/metrics.csv";
  {
    CSVLogger logger(CSVLoggerOptions(dir.path).flush_logs_every_n_steps(1));
    logger.log_metrics({{"acc,top1", 0.5}}, 1);
    logger.log_metrics({{"say \"hi\"", 2.0}, {"acc,top1", 0.75}}, 2);  // a new column: the file is rewritten
    logger.save();
  }
  EXPECT_EQ(read(csv), "\"acc,top1\",\"say \"\"hi\"\"\",step\n0.5,,1\n0.75,2,2\n");
  const std::string script = dir.path + "/read.py", out = dir.path + "/read.txt";
  std::ofstream(script) << "import csv, sys\n"
                           "rows = list(csv.DictReader(open(sys.argv[1], newline='')))\n"
                           "print(sorted(rows[0].keys()), rows[1]['acc,top1'], rows[1]['say \"hi\"'])\n";
  ASSERT_EQ(std::system(("/usr/bin/python3 " + script + " " + csv + " > " + out + " 2>&1").c_str()), 0) << read(out);
  EXPECT_EQ(read(out), "['acc,top1', 'say \"hi\"', 'step'] 0.75 2\n");

  struct BadName : TinyRegression {
    StepOutput training_step(const Batch& b, int64_t i) override {
      log("line\nbreak", 1.0);
      return TinyRegression::training_step(b, i);
    }
  } m;
  Trainer t(quiet(dir.path).max_steps(1).enable_checkpointing(false));
  try {
    t.fit(m, loader(8, 8));
    ADD_FAILURE() << "logged a name with a line break";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("log('line?break'): a metric name must be non-empty and hold no line break"), std::string::npos) << e.what();
  }
}

TEST(Logging, CsvLoggerWritesEveryNStepsAppendsAndWidensItsHeader) {
  TempDir dir;
  const std::string csv = dir.path + "/lightning_logs/version_0/metrics.csv";
  {
    CSVLogger logger(CSVLoggerOptions(dir.path).flush_logs_every_n_steps(3));
    logger.log_metrics({{"a", 1.0}}, 1);
    logger.log_metrics({{"a", 2.0}}, 2);
    EXPECT_FALSE(fs::exists(csv)) << "2 steps: the rows are kept";
    logger.log_metrics({{"a", 3.0}}, 3);
    EXPECT_EQ(read(csv), "a,step\n1,1\n2,2\n3,3\n");
    logger.log_metrics({{"b", 0.5}}, 4);
    logger.save();
    EXPECT_EQ(read(csv), "a,b,step\n1,,1\n2,,2\n3,,3\n,0.5,4\n");
  }
  // Another logger on the same version (as the worker of a later stage) appends.
  CSVLogger again(CSVLoggerOptions(dir.path).version(0));
  again.log_metrics({{"b", 1.5}}, 5);
  again.finalize("success");
  EXPECT_EQ(read(csv), "a,b,step\n1,,1\n2,,2\n3,,3\n,0.5,4\n,1.5,5\n");
  // A line cut short by a killed writer stays apart from the next row.
  std::ofstream(csv, std::ios::app) << "4,";
  again.log_metrics({{"a", 6.0}}, 6);
  again.save();
  EXPECT_EQ(read(csv), "a,b,step\n1,,1\n2,,2\n3,,3\n,0.5,4\n,1.5,5\n4,\n6,,6\n");
  EXPECT_THROW(CSVLogger(CSVLoggerOptions(dir.path).flush_logs_every_n_steps(0)), std::invalid_argument);
}

// Batches built by loader threads train (they were once made in inference
// mode, which backward refuses).
TEST(Loops, LoaderThreadsFeedTraining) {
  TempDir dir;
  TinyRegression m;
  Trainer t(quiet(dir.path).max_epochs(1).enable_checkpointing(false));
  t.fit(m, std::make_shared<DataLoader>(regression_data(64), DataLoaderOptions(8).num_workers(2)));
  EXPECT_EQ(t.global_step(), 8);
}

// A fit that throws still leaves the rows logged before (Lightning's finalize("failed")).
TEST(Logging, AStageThatThrowsStillWritesItsRows) {
  struct ThrowsAtStep5 : TinyRegression {
    StepOutput training_step(const Batch& b, int64_t i) override {
      if (trainer()->global_step() == 5) throw std::runtime_error("boom at step 5");
      return TinyRegression::training_step(b, i);
    }
  } m;
  TempDir dir;
  Trainer t(quiet(dir.path).max_epochs(1).log_every_n_steps(1).enable_checkpointing(false));
  EXPECT_THROW(t.fit(m, loader(80, 8)), std::runtime_error);
  std::istringstream csv(read(dir.path + "/lightning_logs/version_0/metrics.csv"));
  std::vector<std::string> lines;
  for (std::string line; std::getline(csv, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 6u) << "header and the rows of steps 1..5";
  EXPECT_EQ(lines[5].substr(lines[5].rfind(',') + 1), "5");
}

TEST(Logging, UnknownLogLevelIsRefusedBeforeAnyRun) {
  ::setenv("FULGUR_LOG_LEVEL", "loud", 1);
  try {
    Trainer t(quiet("."));
    ADD_FAILURE() << "FULGUR_LOG_LEVEL=loud was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("FULGUR_LOG_LEVEL='loud' is not valid"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("debug, info, warning, error, off"), std::string::npos) << e.what();
  }
  ::unsetenv("FULGUR_LOG_LEVEL");
}

TEST(Logging, NonScalarValueIsRefused) {
  struct Bad : TinyRegression {
    StepOutput training_step(const Batch& b, int64_t i) override {
      log("vec", torch::ones({3}));
      return TinyRegression::training_step(b, i);
    }
  } m;
  TempDir dir;
  Trainer t(quiet(dir.path).max_steps(1).enable_checkpointing(false));
  EXPECT_THROW(t.fit(m, loader(16, 8)), std::invalid_argument);
}

TEST(ProgressBar, PlainLinesOffATerminal) {
  TempDir dir;
  std::ostringstream out;
  auto po = ProgressBarOptions()
      .stream(&out)
      .terminal(false)
      .print_every(2);
  TinyRegression m;
  Trainer t(quiet(dir.path).max_epochs(1).enable_checkpointing(false).callbacks({std::make_shared<ProgressBar>(po)}));
  t.fit(m, loader(32, 8));
  const std::string s = out.str();
  EXPECT_NE(s.find("Epoch 0: 2/4 (50%)"), std::string::npos) << s;
  EXPECT_NE(s.find("Epoch 0: 4/4 (100%)"), std::string::npos) << s;
  EXPECT_NE(s.find("train_loss="), std::string::npos) << s;
  EXPECT_EQ(s.find('\r'), std::string::npos);
}

TEST(ProgressBar, RedrawsOneLineOnATerminal) {
  TempDir dir;
  std::ostringstream out;
  auto po = ProgressBarOptions()
      .stream(&out)
      .terminal(true);
  TinyRegression m;
  Trainer t(quiet(dir.path).max_epochs(1).enable_checkpointing(false).callbacks({std::make_shared<ProgressBar>(po)}));
  t.fit(m, loader(32, 8));
  const std::string s = out.str();
  EXPECT_NE(s.find("\rEpoch 0: 1/4"), std::string::npos);
  EXPECT_EQ(std::count(s.begin(), s.end(), '\n'), 1);
}

// Logs a chosen validation score per epoch.
struct Scored : TinyRegression {
  explicit Scored(std::vector<double> s) : scores(std::move(s)) {}
  StepOutput validation_step(const Batch&, int64_t) override {
    log("score", scores.at(current_epoch()));
    return {};
  }
  std::vector<double> scores;
};

TEST(ModelCheckpoint, KeepsTopKAndLast) {
  TempDir dir;
  Scored m({0.5, 0.2, 0.9, 0.1, 0.3});
  auto ckpt = std::make_shared<ModelCheckpoint>(
      ModelCheckpointOptions().dirpath(dir.path + "/ck").monitor("score").save_top_k(2).save_last(true).filename("{epoch}-{score:.2f}"));
  Trainer t(quiet(dir.path).max_epochs(5).callbacks({ckpt}));
  t.fit(m, loader(16, 8), loader(8, 8));
  std::set<std::string> files;
  for (const auto& e : fs::directory_iterator(dir.path + "/ck")) files.insert(e.path().filename().string());
  EXPECT_EQ(files, (std::set<std::string>{"epoch=1-score=0.20.ckpt", "epoch=3-score=0.10.ckpt", "last.ckpt"}));
  EXPECT_EQ(ckpt->best_model_path(), dir.path + "/ck/epoch=3-score=0.10.ckpt");
  EXPECT_DOUBLE_EQ(*ckpt->best_model_score(), 0.1);
  // last.ckpt is the newest state, loadable.
  Checkpoint last = TorchCheckpointIO().load_checkpoint(dir.path + "/ck/last.ckpt");
  EXPECT_EQ(last.at("epoch").toInt(), 4);
}

TEST(ModelCheckpoint, MonitorNeverLoggedIsAClearError) {
  TempDir dir;
  TinyRegression m;
  auto ckpt = std::make_shared<ModelCheckpoint>(ModelCheckpointOptions().monitor("val_acc"));
  Trainer t(quiet(dir.path).max_epochs(1).callbacks({ckpt}));
  try {
    t.fit(m, loader(16, 8), loader(8, 8));
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("monitor='val_acc'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("val_loss"), std::string::npos) << e.what();
  }
}

TEST(EarlyStopping, StopsAfterPatience) {
  TempDir dir;
  Scored m({1.0, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0});
  auto es = std::make_shared<EarlyStopping>(EarlyStoppingOptions("score").patience(2));
  Trainer t(quiet(dir.path).max_epochs(7).enable_checkpointing(false).callbacks({es}));
  t.fit(m, loader(16, 8), loader(8, 8));
  // Best at epoch 1; epochs 2 and 3 do not improve: stop after epoch 3.
  EXPECT_EQ(t.current_epoch(), 4);
  EXPECT_EQ(es->stopped_epoch(), 3);
  EXPECT_DOUBLE_EQ(es->best_score(), 0.5);
}

TEST(EarlyStopping, MissingMetricIsAnErrorWhenStrict) {
  TempDir dir;
  TinyRegression m;
  auto es = std::make_shared<EarlyStopping>(EarlyStoppingOptions("nope"));
  Trainer t(quiet(dir.path).max_epochs(2).enable_checkpointing(false).callbacks({es}));
  EXPECT_THROW(t.fit(m, loader(16, 8), loader(8, 8)), std::runtime_error);
}

TEST(Checkpoint, ResumeGivesTheLossesOfAnUninterruptedRun) {
  TempDir dir;
  auto make = [] {
    torch::manual_seed(1);
    auto m = std::make_shared<TinyRegression>(0.05);
    return m;
  };
  auto full = make();
  Trainer tf(quiet(dir.path + "/a").max_epochs(3).seed(9).enable_checkpointing(false));
  tf.fit(*full, loader(48, 8, true));
  ASSERT_EQ(full->losses.size(), 18u);

  // Stop after 8 steps (mid-epoch 1), save, resume in a new trainer.
  auto first = make();
  Trainer t1(quiet(dir.path + "/b").max_epochs(3).max_steps(8).seed(9).enable_checkpointing(false));
  t1.fit(*first, loader(48, 8, true));
  t1.save_checkpoint(dir.path + "/mid.ckpt");
  auto second = make();
  Trainer t2(quiet(dir.path + "/b").max_epochs(3).seed(9).enable_checkpointing(false));
  t2.fit(*second, loader(48, 8, true), nullptr, dir.path + "/mid.ckpt");
  std::vector<double> joined = first->losses;
  joined.insert(joined.end(), second->losses.begin(), second->losses.end());
  ASSERT_EQ(joined.size(), full->losses.size());
  for (size_t i = 0; i < joined.size(); ++i) EXPECT_DOUBLE_EQ(joined[i], full->losses[i]) << "step " << i;
}

namespace {

// Throws in the training step after `at` optimizer steps, unless `at` is 0.
struct FailsAfterStep : TinyRegression {
  explicit FailsAfterStep(int64_t at) : TinyRegression(0.05), at(at) {}
  StepOutput training_step(const Batch& b, int64_t i) override {
    if (at > 0 && trainer()->global_step() == at) throw std::runtime_error("fails after step " + std::to_string(at));
    return TinyRegression::training_step(b, i);
  }
  int64_t at;
};

}  // namespace

// A last.ckpt that ModelCheckpoint writes in a batch's end hook
// (every_n_train_steps) counts that batch as done: the run resumed from it
// does not train on the batch again, mid-epoch (step 4 of 6) and after the
// epoch's last batch (step 6), and gives the uninterrupted run's losses.
TEST(Checkpoint, ResumeFromAStepCheckpointDoesNotRepeatItsBatch) {
  for (const int64_t every : {4, 6}) {
    TempDir dir;
    auto run = [&](int64_t fail_at, const std::string& ckpt_path) {
      torch::manual_seed(1);
      auto m = std::make_shared<FailsAfterStep>(fail_at);
      auto cb = std::make_shared<ModelCheckpoint>(
          ModelCheckpointOptions().dirpath(dir.path + "/ck").save_top_k(0).save_last(true).every_n_train_steps(every));
      Trainer t(quiet(dir.path).max_epochs(3).seed(9).callbacks({cb}));
      try {
        t.fit(*m, loader(48, 8, true), nullptr, ckpt_path);
      } catch (const std::runtime_error&) {
      }
      return m;
    };
    auto full = run(0, "");
    ASSERT_EQ(full->losses.size(), 18u);
    auto first = run(every, "");  // fails in the step after the checkpoint
    ASSERT_EQ(first->losses.size(), static_cast<size_t>(every));
    auto second = run(0, dir.path + "/ck/last.ckpt");
    std::vector<double> joined = first->losses;
    joined.insert(joined.end(), second->losses.begin(), second->losses.end());
    ASSERT_EQ(joined.size(), full->losses.size()) << "checkpoint every " << every << " steps";
    for (size_t i = 0; i < joined.size(); ++i) EXPECT_DOUBLE_EQ(joined[i], full->losses[i]) << "step " << i;
    EXPECT_TRUE(torch::equal(second->fc->weight, full->fc->weight));
  }
}

TEST(Checkpoint, LastFindsTheNewestAndMissingStartsFresh) {
  TempDir dir;
  TinyRegression m;
  Trainer t(quiet(dir.path).max_epochs(1).callbacks({std::make_shared<ModelCheckpoint>(ModelCheckpointOptions().save_last(true))}));
  t.fit(m, loader(16, 8));
  TinyRegression m2;
  Trainer t2(quiet(dir.path).max_epochs(2).enable_checkpointing(false));
  t2.fit(m2, loader(16, 8), nullptr, "last");
  EXPECT_EQ(m2.losses.size(), 2u);  // epoch 0 came from the checkpoint
  TempDir empty;
  TinyRegression m3;
  Trainer t3(quiet(empty.path).max_epochs(1).enable_checkpointing(false));
  t3.fit(m3, loader(16, 8), nullptr, "last");
  EXPECT_EQ(m3.losses.size(), 2u);
}

namespace {

// Fits a TinyRegression for one step and saves <dir>/good.ckpt; returns its path.
std::string fit_one_step_and_save(const std::string& dir) {
  TinyRegression m;
  Trainer t(quiet(dir).max_steps(1).enable_checkpointing(false));
  t.fit(m, loader(16, 8));
  const std::string good = dir + "/good.ckpt";
  t.save_checkpoint(good);
  return good;
}

}  // namespace

TEST(Checkpoint, CorruptAndForeignCheckpointsNameFileAndKey) {
  TempDir dir;
  const std::string good = fit_one_step_and_save(dir.path);
  // Truncated.
  const std::string cut = dir.path + "/cut.ckpt";
  fs::copy_file(good, cut);
  fs::resize_file(cut, fs::file_size(good) / 2);
  TinyRegression m2;
  Trainer t2(quiet(dir.path).max_steps(2).enable_checkpointing(false));
  try {
    t2.fit(m2, loader(16, 8), nullptr, cut);
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(cut), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("truncated or corrupt"), std::string::npos) << e.what();
  }
  // Another model: different shapes.
  TinyRegression wide(0.1, 5);
  Trainer t3(quiet(dir.path).max_steps(2).enable_checkpointing(false));
  auto wide_loader = std::make_shared<DataLoader>(regression_data(16, 5), DataLoaderOptions(8));
  try {
    t3.fit(wide, wide_loader, nullptr, good);
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("'fc.weight'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(good), std::string::npos) << e.what();
  }
  // Missing and extra keys; strict=false loads what matches.
  auto sd = make_dict();
  sd.insert("fc.weight", torch::zeros({1, 8}));
  sd.insert("head.bias", torch::zeros({1}));
  TinyRegression m4;
  try {
    load_state_dict(m4, sd, true, "ckpt X");
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("missing key 'fc.bias'"), std::string::npos) << e.what();
  }
  auto warnings = load_state_dict(m4, sd, false, "ckpt X");
  EXPECT_EQ(warnings.size(), 2u);
  EXPECT_TRUE(torch::equal(m4.fc->weight, torch::zeros({1, 8})));
}

TEST(Checkpoint, AtomicWriteLeavesNoTemporaryAndCleansStaleOnes) {
  TempDir dir;
  TorchCheckpointIO io;
  auto c = make_dict();
  c.insert("x", torch::arange(10));
  io.save_checkpoint(c, dir.path + "/a.ckpt");
  for (const auto& e : fs::directory_iterator(dir.path)) EXPECT_EQ(e.path().filename(), "a.ckpt");
  // A temporary from a dead writer (pid 999999 does not exist) is removed.
  std::ofstream(dir.path + "/.a.ckpt.tmp-999999-1") << "partial";
  EXPECT_EQ(TorchCheckpointIO::remove_stale_temporaries(dir.path), 1);
  EXPECT_FALSE(fs::exists(dir.path + "/.a.ckpt.tmp-999999-1"));
}

TEST(Predict, ReturnsOnePredictionPerBatch) {
  struct P : TinyRegression {
    torch::Tensor predict_step(const Batch& b, int64_t) override { return forward(b.data); }
  } m;
  TempDir dir;
  Trainer t(quiet(dir.path));
  auto preds = t.predict(m, loader(20, 8));
  ASSERT_EQ(preds.size(), 3u);
  EXPECT_EQ(preds[2].size(0), 4);
}

namespace {

// Forks; the child sets FULGUR_MALLOC_POLICY (unset when empty), runs `body` and exits with its
// code (3 if it threw something else than below). Returns the child's exit code.
int in_child_with_policy(const std::string& policy, const std::function<int()>& body) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (policy.empty()) ::unsetenv("FULGUR_MALLOC_POLICY");
    else ::setenv("FULGUR_MALLOC_POLICY", policy.c_str(), 1);
    int code = 3;
    try {
      code = body();
    } catch (...) {
    }
    ::_exit(code);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// The child fits two steps, then mallocs 8 MiB and exits 0 if glibc served it from the heap, 1
// if with its own mmap, 2 if fit threw an error naming the value, 3 otherwise.
int child_fit_then_big_malloc(const std::string& policy) {
  return in_child_with_policy(policy, [&] {
    try {
      TempDir dir;
      TinyRegression model;
      Trainer(quiet(dir.path).max_steps(2).logger(false).enable_checkpointing(false)).fit(model, loader(32, 8));
    } catch (const std::invalid_argument& e) {
      const std::string what = e.what();
      return what.find("FULGUR_MALLOC_POLICY='" + policy + "' is not valid") != std::string::npos &&
                     what.find("on, 1, off, 0") != std::string::npos
                 ? 2
                 : 3;
    }
    const size_t mmapped_before = mallinfo2().hblks;
    void* volatile block = std::malloc(size_t{8} << 20);
    const int code = mallinfo2().hblks == mmapped_before ? 0 : 1;
    std::free(block);
    return code;
  });
}

// The child applies the policy (as fit does, but without fit's threads, which could leave the
// child out of arenas). Then a thread of its own (so an arena of its own, as XLA's threads
// have) holds a 40 MiB block, allocates, touches and frees a second one (which needs a second
// heap of that arena), and allocates and touches a second one again: exits 0 if that touch took
// fewer than 1000 page faults (the freed pages were kept), 1 if more. XLA:CPU's 49 MiB
// temporary buffer of charlm's step was such a block: 5,300 page faults a step.
int child_thread_reuses_a_big_block(const std::string& policy) {
  return in_child_with_policy(policy, [] {
    fulgur::runtime::apply_malloc_policy();
    int code = 3;
    std::thread([&] {
      constexpr size_t kBlock = size_t{40} << 20;
      auto touched = [&] {
        // volatile: the compiler may not drop the stores to a block that is only freed.
        volatile char* b = static_cast<char*>(std::malloc(kBlock));
        for (size_t i = 0; i < kBlock; i += 4096) b[i] = 1;
        return const_cast<char*>(b);
      };
      char* held = touched();
      std::free(touched());
      rusage before{}, after{};
      ::getrusage(RUSAGE_THREAD, &before);
      char* again = touched();
      ::getrusage(RUSAGE_THREAD, &after);
      code = after.ru_minflt - before.ru_minflt < 1000 ? 0 : 1;
      std::free(again);
      std::free(held);
    }).join();
    return code;
  });
}

}  // namespace

// The allocator policy (src/runtime/memory.h): after fit, a block of several
// MiB comes from the heap instead of a fresh mmap, so a step's freed
// activations are reused without page faults; the user can opt out.
TEST(MallocPolicy, FitKeepsBigBlocksInTheHeapUnlessTurnedOff) {
  EXPECT_EQ(child_fit_then_big_malloc(""), 0);
  EXPECT_EQ(child_fit_then_big_malloc("on"), 0);
  EXPECT_EQ(child_fit_then_big_malloc("off"), 1);
  EXPECT_EQ(child_fit_then_big_malloc("sometimes"), 2);
}

// The policy keeps the freed pages of a thread's arena too (M_TOP_PAD), not only the main heap's.
TEST(MallocPolicy, AThreadsFreedBigBlockIsReusedWithoutPageFaultsUnlessTurnedOff) {
  EXPECT_EQ(child_thread_reuses_a_big_block(""), 0);
  EXPECT_EQ(child_thread_reuses_a_big_block("off"), 1);
}

namespace {

// Two copies of the same parameters get the same gradients for 20 steps;
// one optimizer steps with optimizer.step(), the other with the fused step.
template <typename Opt, typename Options>
void expect_fused_equals_libtorch(const Options& options) {
  torch::manual_seed(5);
  std::vector<torch::Tensor> a{torch::randn({7, 33}), torch::randn({33}), torch::randn({1})};
  std::vector<torch::Tensor> b;
  for (auto& t : a) {
    t.requires_grad_(true);
    b.push_back(t.detach().clone().requires_grad_(true));
  }
  Opt reference(a, options), fused(b, options);
  for (int step = 0; step < 20; ++step) {
    for (size_t i = 0; i < a.size(); ++i) {
      auto g = torch::randn_like(a[i]);
      if (step == 3 && i == 2) continue;  // a parameter without a gradient this step
      a[i].mutable_grad() = g;
      b[i].mutable_grad() = g.clone();
    }
    reference.step();
    ASSERT_TRUE(fulgur::detail::fused_optimizer_step(fused));
    for (auto& t : a) t.mutable_grad() = torch::Tensor();
    for (auto& t : b) t.mutable_grad() = torch::Tensor();
  }
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(torch::allclose(a[i], b[i], 1e-6, 1e-7)) << "parameter " << i << " differs by "
                                                         << (a[i] - b[i]).abs().max().item<double>();
  }
  // The state is libtorch's own: one more libtorch step from the fused state
  // agrees with one from libtorch's.
  for (size_t i = 0; i < a.size(); ++i) {
    a[i].mutable_grad() = torch::ones_like(a[i]);
    b[i].mutable_grad() = torch::ones_like(b[i]);
  }
  reference.step();
  fused.step();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::allclose(a[i], b[i], 1e-6, 1e-7)) << "parameter " << i;
}

}  // namespace

TEST(FusedOptimizer, AdamMatchesLibtorch) {
  expect_fused_equals_libtorch<torch::optim::Adam>(torch::optim::AdamOptions(1e-2));
  expect_fused_equals_libtorch<torch::optim::Adam>(torch::optim::AdamOptions(1e-2).weight_decay(0.1));
  expect_fused_equals_libtorch<torch::optim::Adam>(torch::optim::AdamOptions(1e-2).amsgrad(true).betas({0.8, 0.9}));
}

TEST(FusedOptimizer, AdamWMatchesLibtorch) {
  expect_fused_equals_libtorch<torch::optim::AdamW>(torch::optim::AdamWOptions(3e-3));
  expect_fused_equals_libtorch<torch::optim::AdamW>(torch::optim::AdamWOptions(3e-3).weight_decay(0.0));
  expect_fused_equals_libtorch<torch::optim::AdamW>(torch::optim::AdamWOptions(3e-3).amsgrad(true).eps(1e-6));
}

TEST(FusedOptimizer, LeavesOtherOptimizersAndTensorsToLibtorch) {
  auto p = torch::randn({4}, torch::requires_grad());
  p.mutable_grad() = torch::ones({4});
  torch::optim::SGD sgd({p}, 0.1);
  EXPECT_FALSE(fulgur::detail::fused_optimizer_step(sgd));
  auto d = torch::randn({4}, torch::dtype(torch::kFloat64).requires_grad(true));
  d.mutable_grad() = torch::ones({4}, torch::kFloat64);
  torch::optim::Adam adam_double({d}, 0.1);
  EXPECT_FALSE(fulgur::detail::fused_optimizer_step(adam_double));
  EXPECT_TRUE(adam_double.state().empty()) << "a refused step must not touch the state";
  torch::optim::Adam adam({p}, 0.1);
  ::setenv("FULGUR_FUSED_OPTIMIZER", "off", 1);
  EXPECT_FALSE(fulgur::detail::fused_optimizer_step(adam));
  ::unsetenv("FULGUR_FUSED_OPTIMIZER");
  const auto before = p.detach().clone();
  EXPECT_TRUE(fulgur::detail::fused_optimizer_step(adam));
  EXPECT_FALSE(torch::equal(before, p.detach()));
}

// A checkpoint with weights and optimizer state but not fulgur's loop state
// (Lightning 2.x keeps loops.fit_loop in another layout).
TEST(Checkpoint, ForeignLoopStateNamesFileAndMissingKey) {
  TempDir dir;
  const std::string good = fit_one_step_and_save(dir.path);
  auto expect_refused = [&](const std::string& name, const std::function<void(Checkpoint&)>& edit, const std::string& key) {
    Checkpoint c = TorchCheckpointIO().load_checkpoint(good);
    edit(c);
    const std::string path = dir.path + "/" + name;
    TorchCheckpointIO().save_checkpoint(c, path);
    TinyRegression m2;
    Trainer t2(quiet(dir.path).max_steps(2).enable_checkpointing(false));
    try {
      t2.fit(m2, loader(16, 8), nullptr, path);
      ADD_FAILURE() << name << " was accepted";
    } catch (const std::exception& e) {
      EXPECT_NE(dynamic_cast<const std::runtime_error*>(&e), nullptr) << name << ": not a std::runtime_error: " << e.what();
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << name << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find("missing key '" + key + "'"), std::string::npos) << name << ": " << e.what();
    }
  };
  expect_refused("no-loops.ckpt", [](Checkpoint& c) { ASSERT_TRUE(c.erase("loops")); }, "loops");
  expect_refused("no-fit-loop.ckpt", [](Checkpoint& c) { c.insert_or_assign("loops", make_dict()); }, "loops.fit_loop");
  expect_refused("lightning-fit-loop.ckpt", [](Checkpoint& c) {
    auto fit_loop = make_dict();
    fit_loop.insert("state_dict", make_dict());
    fit_loop.insert("epoch_loop.state_dict", make_dict());
    auto loops = make_dict();
    loops.insert("fit_loop", fit_loop);
    c.insert_or_assign("loops", loops);
  }, "loops.fit_loop.epoch");
  expect_refused("no-torch-generator.ckpt", [](Checkpoint& c) { c.insert_or_assign("rng_states", make_dict()); },
                 "rng_states.torch");
}

namespace {

// A user's Adam with its own step(): it counts, then steps as Adam does.
struct MyAdam : torch::optim::Adam {
  using torch::optim::Adam::Adam;
  torch::Tensor step(LossClosure closure = nullptr) override {
    ++steps;
    return torch::optim::Adam::step(std::move(closure));
  }
  int steps = 0;
};

struct MyAdamW : torch::optim::AdamW {
  using torch::optim::AdamW::AdamW;
  torch::Tensor step(LossClosure closure = nullptr) override {
    ++steps;
    return torch::optim::AdamW::step(std::move(closure));
  }
  int steps = 0;
};

template <typename Opt>
struct WithOptimizer : fulgur::testing::TinyRegression {
  OptimizerConfig configure_optimizers() override {
    opt = std::make_shared<Opt>(parameters(), 1e-2);
    return opt;
  }
  std::shared_ptr<Opt> opt;
};

template <typename Opt>
int steps_of_a_fit() {
  fulgur::testing::TempDir dir;
  WithOptimizer<Opt> m;
  Trainer t(TrainerOptions().accelerator("cpu").devices(1).max_steps(3).default_root_dir(dir.path)
                .enable_progress_bar(false).enable_checkpointing(false).logger(false).num_sanity_val_steps(0));
  t.fit(m, std::make_shared<DataLoader>(fulgur::testing::regression_data(32), DataLoaderOptions(4)));
  return m.opt->steps;
}

}  // namespace

// The fused step is for libtorch's own Adam and AdamW only: a subclass's step() runs.
TEST(FusedOptimizer, LeavesSubclassesOfAdamToTheirOwnStep) {
  auto p = torch::randn({4}, torch::requires_grad());
  p.mutable_grad() = torch::ones({4});
  MyAdam adam({p}, 0.1);
  EXPECT_FALSE(fulgur::detail::fused_optimizer_step(adam));
  MyAdamW adamw({p}, 0.1);
  EXPECT_FALSE(fulgur::detail::fused_optimizer_step(adamw));
  EXPECT_EQ(steps_of_a_fit<MyAdam>(), 3);
  EXPECT_EQ(steps_of_a_fit<MyAdamW>(), 3);
}

namespace {

// TinyRegression with two optimizers (manual optimization), so that one
// LearningRateMonitor row names both: RMSprop (lr 0.01) and MyAdam (above; lr
// 0.002), which the optimizer table serves through its base, Adam.
struct TwoOptimizers : TinyRegression {
  TwoOptimizers() { set_automatic_optimization(false); }
  StepOutput training_step(const Batch& b, int64_t) override {
    auto loss = torch::mse_loss(forward(b.data), b.target);
    for (auto& o : optimizers()) o.zero_grad();
    manual_backward(loss);
    for (auto& o : optimizers()) o.step();
    return StepOutput();
  }
  OptimizerConfig configure_optimizers() override {
    OptimizerConfig c;
    c.optimizers.push_back(std::make_shared<torch::optim::RMSprop>(parameters(), torch::optim::RMSpropOptions(0.01)));
    c.optimizers.push_back(std::make_shared<MyAdam>(parameters(), torch::optim::AdamOptions(0.002)));
    return c;
  }
};

}  // namespace

TEST(Callbacks, LearningRateMonitorNamesEachOptimizerByItsPythonClass) {
  TempDir dir;
  TwoOptimizers m;
  Trainer t(quiet(dir.path).max_epochs(1).enable_checkpointing(false).enable_model_summary(false)
                .callbacks({std::make_shared<LearningRateMonitor>("epoch")}));
  t.fit(m, loader(16, 8));
  // The first row is the monitor's, at step 0: each column's value by its name.
  std::istringstream csv(read(dir.path + "/lightning_logs/version_0/metrics.csv"));
  auto cells = [](const std::string& line) {
    std::vector<std::string> out;
    std::stringstream ss(line);
    for (std::string c; std::getline(ss, c, ',');) out.push_back(c);
    return out;
  };
  std::string header, row;
  std::getline(csv, header);
  std::getline(csv, row);
  std::map<std::string, std::string> value;
  const auto names = cells(header), values = cells(row);
  for (size_t i = 0; i < names.size() && i < values.size(); ++i) value[names[i]] = values[i];
  EXPECT_EQ(value["lr-RMSprop"], "0.01") << header << "\n" << row;
  EXPECT_EQ(value["lr-Adam"], "0.002") << header << "\n" << row;
  EXPECT_EQ(header.find("lr-Optimizer"), std::string::npos) << header;
}

// Issue 32, A3: with validation every second epoch, ModelCheckpoint and EarlyStopping that
// monitor a validation metric act at validation end only, as in Lightning; they used to look
// for it at the end of epoch 0 and throw. Checkpoints come from the epochs that validated.
TEST(Callbacks, MonitoredCallbacksWaitForValidationWhenItSkipsEpochs) {
  TempDir dir;
  TinyRegression m;
  auto mc = std::make_shared<ModelCheckpoint>(
      ModelCheckpointOptions().dirpath(dir.path + "/ck").monitor("val_loss").save_top_k(-1));
  auto es = std::make_shared<EarlyStopping>(EarlyStoppingOptions("val_loss").patience(10));
  Trainer t(quiet(dir.path).max_epochs(4).check_val_every_n_epoch(2).num_sanity_val_steps(0).callbacks({mc, es}));
  t.fit(m, loader(32, 8), loader(16, 8));
  std::set<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir.path + "/ck")) names.insert(e.path().filename().string());
  EXPECT_EQ(names, (std::set<std::string>{"epoch=1-step=8.ckpt", "epoch=3-step=16.ckpt"}));
  EXPECT_EQ(es->stopped_epoch(), 0);
  EXPECT_EQ(t.current_epoch(), 4);
}
