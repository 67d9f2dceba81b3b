// SPDX-License-Identifier: Apache-2.0
// What a run tells its user (issue 14): the model summary at fit start,
// log_dict and the logging options, the lines at the end of fit, and the
// progress bar's ETA. Real fit runs; stderr is captured where fulgur's
// messages go.
#include "support.h"

#include <fulgur/callbacks/model_summary.h>
#include <fulgur/lightning_module.h>
#include <fulgur/loggers/csv_logger.h>
#include <fulgur/loggers/tensorboard_logger.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <csignal>
#include <regex>
#include <sstream>

using namespace fulgur;
using fulgur::testing::regression_data;
using fulgur::testing::TempDir;
using fulgur::testing::TinyRegression;
using ::testing::HasSubstr;
using ::testing::Not;

namespace {

TrainerOptions quiet(const std::string& root) {
  return TrainerOptions().accelerator("cpu").devices(1).default_root_dir(root).enable_progress_bar(false)
      .num_sanity_val_steps(0);
}

std::shared_ptr<DataLoader> loader(int64_t n, int64_t batch) {
  return std::make_shared<DataLoader>(regression_data(n), DataLoaderOptions(batch));
}

int count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// fc1 20*32+32 = 672, fc2 32*4+4 = 132, a frozen head 4*2+2 = 10, and a
// parameter of its own (3) without a row.
struct Known : TinyRegression {
  Known() {
    fc1 = register_module("fc1", torch::nn::Linear(20, 32));
    fc2 = register_module("fc2", torch::nn::Linear(32, 4));
    frozen = register_module("frozen", torch::nn::Linear(4, 2));
    for (auto& p : frozen->parameters()) p.set_requires_grad(false);
    own = register_parameter("own", torch::zeros({3}));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, frozen{nullptr};
  torch::Tensor own;
};

}  // namespace

TEST(ModelSummary, CountsTheParametersOfAKnownModule) {
  Known m;
  const ModelSummaryTable t = summarize(m);
  ASSERT_EQ(t.rows.size(), 4u);  // fc (TinyRegression's 8*1+1 = 9), fc1, fc2, frozen
  EXPECT_EQ(t.rows[0].name, "fc");
  EXPECT_EQ(t.rows[0].params, 9);
  EXPECT_EQ(t.rows[1].name, "fc1");
  EXPECT_EQ(t.rows[1].type, "Linear");
  EXPECT_EQ(t.rows[1].params, 672);
  EXPECT_EQ(t.rows[2].params, 132);
  EXPECT_EQ(t.rows[3].params, 10);
  EXPECT_EQ(t.trainable_params, 9 + 672 + 132 + 3);
  EXPECT_EQ(t.non_trainable_params, 10);
  EXPECT_EQ(t.total_params(), 826);
  EXPECT_DOUBLE_EQ(t.size_mb, 826 * 4 / 1e6);
  const auto lines = format_summary(t);
  ASSERT_EQ(lines.size(), 11u);  // header, rule, 4 rows, rule, 4 totals
  EXPECT_EQ(lines[0], "  | Name   | Type   | Params");
  EXPECT_EQ(lines[3], "1 | fc1    | Linear | 672");
  EXPECT_EQ(lines[7], "816       Trainable params");
  EXPECT_EQ(lines[8], "10        Non-trainable params");
  EXPECT_EQ(lines[9], "826       Total params");
  EXPECT_EQ(lines[10], "0.003     Total estimated model params size (MB)");
}

TEST(ModelSummary, PrintedAtFitStartOffWhenAskedAndOnceWithTwoWorkers) {
  TempDir dir;
  // The forked workers first: with a CUDA libtorch on a GPU machine, a process that ran a backward
  // cannot fork workers that run one (Strategy::backward says so).
  {
    TinyRegression m;
    ::testing::internal::CaptureStderr();
    Trainer(quiet(dir.path).devices(2).strategy("ddp").max_epochs(1)).fit(m, loader(16, 4));
    const std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_EQ(count(err, "Total params"), 1) << err;
  }
  {
    TinyRegression m;
    ::testing::internal::CaptureStderr();
    Trainer(quiet(dir.path).max_epochs(1)).fit(m, loader(16, 8));
    const std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_THAT(err, HasSubstr("fulgur: 0 | fc   | Linear | 9\n"));
    EXPECT_EQ(count(err, "fulgur: 9         Total params\n"), 1) << err;
  }
  {
    TinyRegression m;
    ::testing::internal::CaptureStderr();
    Trainer(quiet(dir.path).max_epochs(1).enable_model_summary(false)).fit(m, loader(16, 8));
    EXPECT_THAT(::testing::internal::GetCapturedStderr(), Not(HasSubstr("Total params")));
  }
}

namespace {

// log_dict of tensors and of doubles, with the options applied to each entry.
struct Dicts : TinyRegression {
  StepOutput training_step(const Batch& b, int64_t i) override {
    log_dict({{"a", torch::tensor(static_cast<double>(i))}, {"b", torch::tensor(2.0 * i)}},
             LogOptions().on_step(false).on_epoch(true).reduce_fx("sum"));
    log_dict(std::map<std::string, double>{{"hidden", 7.0}}, LogOptions().logger(false));
    return TinyRegression::training_step(b, i);
  }
};

// Rank r logs r + 1 with rank_zero_only: only rank 0's 1 counts.
struct RankZeroOnly : TinyRegression {
  StepOutput training_step(const Batch& b, int64_t i) override {
    log("who", static_cast<double>(trainer()->global_rank() + 1),
        LogOptions().on_epoch(true).on_step(false).rank_zero_only(true));
    return TinyRegression::training_step(b, i);
  }
};

struct RankZeroOnlySynced : TinyRegression {
  StepOutput training_step(const Batch& b, int64_t i) override {
    log("x", 1.0, LogOptions().rank_zero_only(true).sync_dist(true));
    return TinyRegression::training_step(b, i);
  }
};

}  // namespace

TEST(Logging, LogDictLogsEachEntryWithTheGivenOptions) {
  TempDir dir;
  Dicts m;
  Trainer t(quiet(dir.path).max_epochs(1).log_every_n_steps(1).enable_checkpointing(false));
  t.fit(m, loader(32, 8));
  // Batches 0..3 summed: a = 0+1+2+3, b = twice that.
  EXPECT_DOUBLE_EQ(t.callback_metrics().at("a"), 6.0);
  EXPECT_DOUBLE_EQ(t.callback_metrics().at("b"), 12.0);
  // logger(false): neither in metrics.csv nor (as a step value) in callback_metrics.
  EXPECT_EQ(t.callback_metrics().count("hidden"), 0u);
  const std::string csv = fulgur::testing::read_file(dir.path + "/lightning_logs/version_0/metrics.csv");
  EXPECT_EQ(csv.substr(0, csv.find('\n')), "a,b,epoch,train_loss,step");
}

TEST(Logging, RankZeroOnlyKeepsRankZerosValueAndRefusesSyncDist) {
  TempDir dir;
  RankZeroOnly m;
  Trainer t(quiet(dir.path).devices(2).strategy("ddp").max_epochs(1).enable_checkpointing(false));
  t.fit(m, loader(16, 4));
  EXPECT_DOUBLE_EQ(t.callback_metrics().at("who"), 1.0);

  RankZeroOnlySynced bad;
  Trainer t2(quiet(dir.path).max_epochs(1).enable_checkpointing(false));
  try {
    t2.fit(bad, loader(16, 4));
    FAIL() << "rank_zero_only with sync_dist was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("log('x'): rank_zero_only=true with sync_dist=true"));
  }
}

namespace {

std::string fit_stderr(TrainerOptions options, LightningModule& m, std::shared_ptr<BatchSource> train,
                       std::shared_ptr<BatchSource> val = nullptr) {
  ::testing::internal::CaptureStderr();
  try {
    Trainer(std::move(options)).fit(m, std::move(train), std::move(val));
  } catch (...) {
    ::testing::internal::GetCapturedStderr();
    throw;
  }
  return ::testing::internal::GetCapturedStderr();
}

// Validation loss that stops improving after epoch 1.
struct Plateau : TinyRegression {
  StepOutput validation_step(const Batch&, int64_t) override {
    log("val_loss", current_epoch() < 1 ? 1.0 - 0.25 * current_epoch() : 0.75);
    return {};
  }
};

struct SignalAtStep3 : TinyRegression {
  StepOutput training_step(const Batch& b, int64_t i) override {
    if (global_step() == 3) ::raise(SIGTERM);
    return TinyRegression::training_step(b, i);
  }
};

}  // namespace

TEST(RunEnd, SaysWhyFitStoppedWhereTheBestCheckpointIsAndWhereTheLogsAre) {
  TempDir dir;
  const std::string logs = dir.path + "/lightning_logs/version_";
  {
    TinyRegression m;
    const std::string err = fit_stderr(quiet(dir.path).max_epochs(2), m, loader(16, 8));
    EXPECT_THAT(err, HasSubstr("fulgur: fit stopped at epoch 2, step 4: max_epochs=2 reached\n"));
    EXPECT_THAT(err, HasSubstr("fulgur: best checkpoint: " + logs + "0/checkpoints/epoch=1-step=4.ckpt"
                               " (the most recent; no monitor)\n"));
    EXPECT_THAT(err, HasSubstr("fulgur: logs: " + logs + "0\n"));
  }
  {
    TinyRegression m;
    const std::string err = fit_stderr(quiet(dir.path).max_steps(3).logger(false).enable_checkpointing(false), m,
                                       loader(16, 8));
    EXPECT_THAT(err, HasSubstr("fulgur: fit stopped at epoch 1, step 3: max_steps=3 reached\n"));
    EXPECT_THAT(err, HasSubstr("fulgur: no checkpoints (enable_checkpointing is off)\n"));
    EXPECT_THAT(err, HasSubstr("fulgur: no logs (logger is off)\n"));
  }
  {
    // val_loss 1.0, 0.75, 0.75, 0.75: with patience 2 the check of epoch 3 stops the run.
    Plateau m;
    auto es = std::make_shared<EarlyStopping>(EarlyStoppingOptions("val_loss").patience(2));
    auto ck = std::make_shared<ModelCheckpoint>(ModelCheckpointOptions().monitor("val_loss"));
    const std::string err =
        fit_stderr(quiet(dir.path).max_epochs(10).callbacks({es, ck}), m, loader(16, 8), loader(8, 8));
    EXPECT_THAT(err, HasSubstr("fulgur: fit stopped at epoch 4, step 8: EarlyStopping on val_loss=0.75 (Monitored "
                               "metric val_loss did not improve in the last 2 checks; best score 0.75)\n"));
    EXPECT_THAT(err, HasSubstr("fulgur: best checkpoint: " + logs + "1/checkpoints/epoch=1-step=4.ckpt (val_loss=0.75)\n"));
    EXPECT_THAT(err, HasSubstr("fulgur: logs: " + logs + "1\n"));
  }
  {
    SignalAtStep3 m;
    ::testing::internal::CaptureStderr();
    EXPECT_THROW(Trainer(quiet(dir.path).max_epochs(5)).fit(m, loader(16, 4)), WorkerFailure);
    const std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_THAT(err, HasSubstr("fulgur: fit stopped at epoch 0, step 4: signal 15 (SIGTERM); last checkpoint " + logs +
                               "2/checkpoints/last.ckpt\n"));
    EXPECT_THAT(err, HasSubstr("fulgur: logs: " + logs + "2\n"));
  }
  {
    // Two loggers in one version folder: the folder is named once.
    TinyRegression m;
    auto both = std::vector<std::shared_ptr<Logger>>{std::make_shared<CSVLogger>(dir.path),
                                                     std::make_shared<TensorBoardLogger>(dir.path)};
    const std::string err = fit_stderr(quiet(dir.path).max_epochs(1).logger(both), m, loader(16, 8));
    EXPECT_THAT(err, HasSubstr("fulgur: logs: " + logs + "3\n"));
  }
}

TEST(ProgressBar, ShowsTheEtaOfTheEpoch) {
  TempDir dir;
  TinyRegression m;
  std::ostringstream out;
  auto po = ProgressBarOptions()
      .stream(&out)
      .terminal(false)
      .print_every(1);
  Trainer t(quiet(dir.path).max_epochs(1).enable_progress_bar(true).callbacks({std::make_shared<ProgressBar>(po)}));
  t.fit(m, loader(16, 4));
  const std::string text = out.str();
  // Each line: elapsed, the ETA of the rest of the epoch, the rate; the last one's ETA is 0.
  const std::regex line(R"(Epoch 0: ([1-4])/4 \(\d+%\) \[[0-9.]+s, ETA ([0-9.]+)s, [0-9.]+ it/s\])");
  int lines = 0;
  std::istringstream in(text);
  std::string last_eta;
  for (std::string l; std::getline(in, l);) {
    std::smatch mt;
    if (!std::regex_search(l, mt, line)) continue;
    ++lines;
    last_eta = mt[2];
  }
  EXPECT_EQ(lines, 4) << text;
  EXPECT_EQ(last_eta, "0.0") << text;
}
