// SPDX-License-Identifier: Apache-2.0
// The callbacks a Lightning user expects beyond checkpoints and early stopping:
// WeightAveraging (EMA), Timer, GradientAccumulationScheduler; and warnings written once per
// process run. lr_find and LearningRateFinder: test_lr_finder.cpp.
#include "support.h"

#include "runtime/log.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <thread>

using namespace fulgur;
using fulgur::testing::regression_data;
using fulgur::testing::TempDir;
using fulgur::testing::TinyRegression;
using ::testing::HasSubstr;

namespace fs = std::filesystem;

namespace {

TrainerOptions quiet(const std::string& root) { return fulgur::testing::quiet_cpu_options(root); }

std::shared_ptr<DataLoader> loader(int64_t n, int64_t batch) { return fulgur::testing::regression_loader(n, batch); }

using fulgur::testing::Weights;
using fulgur::testing::weights_of;

Weights weights_of(const c10::IValue& state_dict) {
  Weights out;
  for (const auto& kv : state_dict.toGenericDict()) out.emplace_back(kv.key().toStringRef(), kv.value().toTensor());
  return out;
}

// The weights of `a` and `b` agree name by name within `tol` (0: bit for bit).
void expect_same(const Weights& a, const Weights& b, double tol, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first) << what;
    if (tol == 0) {
      EXPECT_TRUE(torch::equal(a[i].second, b[i].second)) << what << ": " << a[i].first;
    } else {
      EXPECT_TRUE(torch::allclose(a[i].second, b[i].second, 0, tol)) << what << ": " << a[i].first;
    }
  }
}

// The module's weights after every optimizer step, at every validation batch and at each epoch end.
struct Recorder : Callback {
  std::string state_key() const override { return "Recorder"; }
  void on_train_batch_end(Trainer&, LightningModule& m, const StepOutput&, const Batch&, int64_t) override {
    after_step.push_back(weights_of(m));
  }
  void on_validation_batch_end(Trainer&, LightningModule& m, int64_t) override { in_validation.push_back(weights_of(m)); }
  void on_train_epoch_end(Trainer&, LightningModule& m) override { at_epoch_end.push_back(weights_of(m)); }
  std::vector<Weights> after_step, in_validation, at_epoch_end;
};

// EMA with `decay` over the recorded weights, as torch's AveragedModel with get_ema_avg_fn:
// the first update copies, each later one is decay * average + (1 - decay) * current.
Weights ema_of(const std::vector<Weights>& steps, size_t count, double decay) {
  Weights avg = steps.at(0);
  for (auto& [name, t] : avg) t = t.clone();
  for (size_t k = 1; k < count; ++k)
    for (size_t i = 0; i < avg.size(); ++i) avg[i].second = avg[i].second * decay + steps[k][i].second * (1.0 - decay);
  return avg;
}

Checkpoint load(const std::string& path) { return TorchCheckpointIO().load_checkpoint(path); }

}  // namespace

// The average after each of five steps is the EMA of the weights recorded after them; validation
// runs on it, training goes on with the module's own weights, and after fit the module holds it.
TEST(WeightAveraging, EmaEqualsTheHandComputedAverageAndIsUsedForValidationAndAfterFit) {
  TempDir dir;
  seed_everything(1);
  TinyRegression m(0.1);
  auto recorder = std::make_shared<Recorder>();
  auto ema = std::make_shared<EMAWeightAveraging>(EMAWeightAveragingOptions().decay(0.5));
  const std::string ck = dir.path + "/ck";
  Trainer t(quiet(dir.path).max_epochs(1).limit_train_batches(5).logger(false).callbacks(
      {recorder, ema,
       std::make_shared<ModelCheckpoint>(ModelCheckpointOptions().dirpath(ck).every_n_train_steps(1).save_top_k(-1))}));
  t.fit(m, loader(80, 8), loader(16, 8));
  ASSERT_EQ(recorder->after_step.size(), 5u);
  EXPECT_EQ(ema->num_averaged(), 5);
  const Weights expected = ema_of(recorder->after_step, 5, 0.5);
  // Five SGD steps move the weights: the average is not the last step's weights.
  EXPECT_FALSE(torch::allclose(expected[0].second, recorder->after_step[4][0].second, 0, 1e-4));
  ASSERT_EQ(recorder->in_validation.size(), 2u);
  for (const auto& w : recorder->in_validation) expect_same(w, expected, 1e-6, "validation's weights");
  ASSERT_EQ(recorder->at_epoch_end.size(), 1u);
  expect_same(recorder->at_epoch_end[0], recorder->after_step[4], 0, "the module's own weights after validation");
  expect_same(weights_of(m), expected, 1e-6, "the module after fit");

  // The checkpoint of step 3: the average of three steps as state_dict, the module's own beside it.
  const Checkpoint c = load(ck + "/epoch=0-step=3.ckpt");
  expect_same(weights_of(c.at("state_dict")), ema_of(recorder->after_step, 3, 0.5), 1e-6, "state_dict at step 3");
  expect_same(weights_of(c.at("current_model_state")), recorder->after_step[2], 0, "current_model_state at step 3");
  EXPECT_EQ(c.at("averaging_state").toGenericDict().at("n_averaged").toTensor().item<int64_t>(), 3);
  // load_from_checkpoint (as test and predict with a ckpt_path) gets the average.
  TinyRegression loaded;
  load_from_checkpoint(loaded, ck + "/epoch=0-step=3.ckpt");
  expect_same(weights_of(loaded), ema_of(recorder->after_step, 3, 0.5), 1e-6, "load_from_checkpoint");
}

// Resumed from the checkpoint of step 3, a fit to step 7 ends with the weights and the average
// of the uninterrupted run, bit for bit.
TEST(WeightAveraging, ResumeContinuesTheAverageExactly) {
  TempDir dir;
  const std::string ck = dir.path + "/ck";
  auto run = [&](uint64_t seed, const std::string& ckpt_path, Weights* own) {
    seed_everything(seed);
    TinyRegression m(0.1);
    auto recorder = std::make_shared<Recorder>();
    auto ema = std::make_shared<EMAWeightAveraging>(EMAWeightAveragingOptions().decay(0.7));
    Trainer t(quiet(dir.path).max_steps(7).logger(false).callbacks(
        {recorder, ema,
         std::make_shared<ModelCheckpoint>(ModelCheckpointOptions().dirpath(ck).every_n_train_steps(1).save_top_k(-1))}));
    t.fit(m, loader(40, 8), nullptr, ckpt_path);  // 5 batches an epoch: the resume crosses an epoch end
    *own = recorder->after_step.back();
    EXPECT_EQ(ema->num_averaged(), 7);
    return weights_of(m);
  };
  Weights own_a, own_b;
  const Weights a = run(1, "", &own_a);
  const Weights b = run(2, ck + "/epoch=0-step=3.ckpt", &own_b);
  expect_same(b, a, 0, "the average after the resumed run");
  expect_same(own_b, own_a, 0, "the module's own weights after the last step");
}

// Without an averaging function the average is the equal one of every step's weights (SWA).
TEST(WeightAveraging, DefaultIsTheEqualAverageOfTheSteps) {
  TempDir dir;
  TinyRegression m(0.1);
  auto recorder = std::make_shared<Recorder>();
  auto swa = std::make_shared<WeightAveraging>();
  Trainer t(quiet(dir.path).max_steps(4).logger(false).enable_checkpointing(false).callbacks({recorder, swa}));
  t.fit(m, loader(80, 8));
  ASSERT_EQ(recorder->after_step.size(), 4u);
  Weights mean = recorder->after_step[0];
  for (size_t i = 0; i < mean.size(); ++i) {
    mean[i].second = (recorder->after_step[0][i].second + recorder->after_step[1][i].second +
                      recorder->after_step[2][i].second + recorder->after_step[3][i].second) / 4.0;
  }
  expect_same(weights_of(m), mean, 1e-6, "the module after fit");
}

TEST(WeightAveraging, UpdateScheduleAndBadOptions) {
  TempDir dir;
  TinyRegression m;
  // Steps 0..5: updates at the even step indices from 2 on (2 and 4).
  auto ema = std::make_shared<EMAWeightAveraging>(
      EMAWeightAveragingOptions().update_starting_at_step(2).update_every_n_steps(2));
  Trainer t(quiet(dir.path).max_steps(6).logger(false).enable_checkpointing(false).callbacks({ema}));
  t.fit(m, loader(80, 8));
  EXPECT_EQ(ema->num_averaged(), 2);
  EXPECT_THAT([] { EMAWeightAveraging e(EMAWeightAveragingOptions().decay(1.5)); },
              ::testing::ThrowsMessage<std::invalid_argument>(HasSubstr("decay=1.5")));
  EXPECT_THAT([] { EMAWeightAveraging e(EMAWeightAveragingOptions().update_every_n_steps(0)); },
              ::testing::ThrowsMessage<std::invalid_argument>(HasSubstr("update_every_n_steps=0 must be >= 1")));
}

namespace {

// Makes each batch take `ms` milliseconds.
struct SlowBatches : Callback {
  explicit SlowBatches(int ms) : ms(ms) {}
  std::string state_key() const override { return "SlowBatches"; }
  void on_train_batch_end(Trainer&, LightningModule&, const StepOutput&, const Batch&, int64_t) override {
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  }
  int ms;
};

}  // namespace

TEST(Timer, ShortDurationStopsFitAndResumeCarriesTheElapsedTime) {
  TempDir dir;
  TinyRegression m;
  auto timer = std::make_shared<Timer>(TimerOptions().duration(std::chrono::milliseconds(200)));
  Trainer t(quiet(dir.path).max_epochs(50).logger(false).enable_checkpointing(false).callbacks(
      {std::make_shared<SlowBatches>(20), timer}));
  ::testing::internal::CaptureStderr();
  t.fit(m, loader(80, 8));
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_LT(t.global_step(), 50 * 10) << "max_epochs would run 500 steps";
  EXPECT_GE(t.global_step(), 1);
  EXPECT_LT(t.current_epoch(), 50);
  EXPECT_GE(timer->time_elapsed("train"), 0.2);
  EXPECT_LE(*timer->time_remaining("train"), 0.0);
  EXPECT_THAT(timer->reason(), HasSubstr("Timer: time limit of 0:00:00 reached"));
  EXPECT_THAT(err, HasSubstr("step " + std::to_string(t.global_step()) + ": Timer: time limit of 0:00:00 reached"));
  EXPECT_THAT(err, HasSubstr("Time limit reached."));

  const std::string path = dir.path + "/timer.ckpt";
  t.save_checkpoint(path);
  const double saved = load(path).at("callbacks").toGenericDict().at("Timer").toGenericDict().at("time_elapsed")
                           .toGenericDict().at("train").toDouble();
  EXPECT_NEAR(saved, timer->time_elapsed("train"), 1e-9);

  // A resumed run whose time is spent stops before its first batch.
  TinyRegression m2;
  auto spent = std::make_shared<Timer>(TimerOptions().duration(std::chrono::milliseconds(100)));
  Trainer t2(quiet(dir.path).max_epochs(50).logger(false).enable_checkpointing(false).callbacks({spent}));
  t2.fit(m2, loader(80, 8), nullptr, path);
  EXPECT_EQ(t2.global_step(), t.global_step());
  EXPECT_GE(spent->time_elapsed(), saved);
  EXPECT_FALSE(spent->reason().empty());

  // One with time left counts on from the saved time.
  TinyRegression m3;
  auto more = std::make_shared<Timer>(TimerOptions().duration("00:01:00:00"));
  EXPECT_EQ(more->options().duration()->count(), 3600.0);
  Trainer t3(quiet(dir.path).max_steps(t.global_step() + 2).logger(false).enable_checkpointing(false).callbacks({more}));
  t3.fit(m3, loader(80, 8), nullptr, path);
  EXPECT_EQ(t3.global_step(), t.global_step() + 2);
  EXPECT_GT(more->time_elapsed(), saved);
  EXPECT_LT(more->time_elapsed(), saved + 30);
  EXPECT_TRUE(more->reason().empty());
}

TEST(Timer, BadInputsAreNamed) {
  EXPECT_THAT([] { Timer t(TimerOptions().interval("hour")); },
              ::testing::ThrowsMessage<std::invalid_argument>(HasSubstr("interval 'hour' is not known")));
  EXPECT_THAT([] { TimerOptions().duration("1:2:3"); },
              ::testing::ThrowsMessage<std::invalid_argument>(HasSubstr("\"1:2:3\" is not a valid duration")));
  EXPECT_THAT([] { Timer t(TimerOptions().duration(std::chrono::seconds(-1))); },
              ::testing::ThrowsMessage<std::invalid_argument>(HasSubstr("is negative")));
  EXPECT_THAT([] { Timer().time_elapsed("fit"); },
              ::testing::ThrowsMessage<std::invalid_argument>(HasSubstr("stage 'fit' is not known")));
  EXPECT_EQ(TimerOptions().duration("2:03:04:05").duration()->count(), 2 * 86400 + 3 * 3600 + 4 * 60 + 5);
}

namespace {

struct StepsPerEpoch : Callback {
  std::string state_key() const override { return "StepsPerEpoch"; }
  void on_train_epoch_end(Trainer& t, LightningModule&) override {
    steps.push_back(t.global_step());
    accumulate.push_back(t.accumulate_grad_batches());
  }
  std::vector<int64_t> steps, accumulate;
};

}  // namespace

// 10 batches an epoch: epoch 0 steps after each (10), epoch 1 every 2 (5), epochs 2 and 3 every
// 4 (4 + 4 + the last 2 batches: 3 each).
TEST(GradientAccumulationScheduler, OptimizerStepsPerEpochFollowTheSchedule) {
  TempDir dir;
  TinyRegression m;
  auto record = std::make_shared<StepsPerEpoch>();
  auto schedule = std::make_shared<GradientAccumulationScheduler>(std::map<int64_t, int64_t>{{1, 2}, {2, 4}});
  EXPECT_EQ(schedule->scheduling().at(0), 1);
  Trainer t(quiet(dir.path).max_epochs(4).logger(false).enable_checkpointing(false).callbacks({record, schedule}));
  t.fit(m, loader(80, 8));
  EXPECT_EQ(record->steps, (std::vector<int64_t>{10, 15, 18, 21}));
  EXPECT_EQ(record->accumulate, (std::vector<int64_t>{1, 2, 4, 4}));
}

TEST(GradientAccumulationScheduler, BadInputsAndTheClashWithTheTrainerOption) {
  using Schedule = std::map<int64_t, int64_t>;
  EXPECT_THAT([] { GradientAccumulationScheduler s(Schedule{}); },
              ::testing::ThrowsMessage<std::invalid_argument>(HasSubstr("the scheduling is empty")));
  EXPECT_THAT([] { GradientAccumulationScheduler s(Schedule{{-1, 2}}); },
              ::testing::ThrowsMessage<std::invalid_argument>(HasSubstr("epoch -1 is negative")));
  EXPECT_THAT([] { GradientAccumulationScheduler s(Schedule{{0, 2}, {3, 0}}); },
              ::testing::ThrowsMessage<std::invalid_argument>(HasSubstr("accumulate_grad_batches=0 for epoch 3 must be >= 1")));
  EXPECT_THAT(
      [] {
        Trainer t(TrainerOptions().accumulate_grad_batches(2).callbacks(
            {std::make_shared<GradientAccumulationScheduler>(Schedule{{1, 4}})}));
      },
      ::testing::ThrowsMessage<std::invalid_argument>(HasSubstr("accumulate_grad_batches=2 and a GradientAccumulationScheduler")));
}

namespace {

int64_t count_of(const std::string& text, const std::string& what) {
  int64_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

}  // namespace

TEST(WarnOnce, SameTextIsWrittenOncePerProcess) {
  ::testing::internal::CaptureStderr();
  EXPECT_TRUE(runtime::warn_rank_zero_once("WarnOnce test: a"));
  EXPECT_FALSE(runtime::warn_rank_zero_once("WarnOnce test: a"));
  EXPECT_TRUE(runtime::warn_rank_zero_once("WarnOnce test: b"));
  EXPECT_FALSE(runtime::warn_once("WarnOnce test: b"));
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(err, "fulgur: warning: WarnOnce test: a\nfulgur: warning: WarnOnce test: b\n");
}

// ckpt_path="last" with no last.ckpt anywhere warns in every validate and test: one line.
TEST(WarnOnce, ALibraryWarningMetInEveryStageIsOneLine) {
  TempDir dir;
  TinyRegression m;
  Trainer t(quiet(dir.path).logger(false));
  ::testing::internal::CaptureStderr();
  for (int i = 0; i < 3; ++i) {
    t.validate(m, loader(16, 8), "last");
    t.test(m, loader(16, 8), "last");
  }
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(count_of(err, "no last.ckpt was found"), 1) << err;
}

namespace {

// Warns in every stage's setup, on every rank: one warning of rank 0's, and one of each rank's.
struct WarnsInSetup : Callback {
  std::string state_key() const override { return "WarnsInSetup"; }
  void setup(Trainer&, LightningModule&, Stage) override {
    runtime::warn_rank_zero_once("WarnsInSetup: from rank zero");
    runtime::warn_once("WarnsInSetup: from every rank");
  }
};

// What a child process running `body` wrote to stderr (a child: its launches get a private
// folder, and so a record of shown messages, of their own).
std::string stderr_of_child(const std::string& path, const std::function<void()>& body) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, STDERR_FILENO);
    int code = 0;
    try {
      body();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child failed: %s\n", e.what());
      code = 1;
    }
    ::_exit(code);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << fulgur::testing::read_file(path);
  return fulgur::testing::read_file(path);
}

}  // namespace

// Two stages of two worker processes each (fit, then validate: four workers in all), each
// worker warning in its setup: each warning is one line for the whole run, as is the cluster
// environment's line.
TEST(WarnOnce, WorkersOfTwoStagesWriteEachWarningOnce) {
  TempDir dir;
  const std::string err = stderr_of_child(dir.path + "/stderr.txt", [&] {
    TinyRegression m;
    Trainer t(quiet(dir.path).strategy("ddp").devices(2).max_steps(2).logger(false).enable_checkpointing(false)
                  .callbacks({std::make_shared<WarnsInSetup>()}));
    t.fit(m, loader(32, 8));
    t.validate(m, loader(16, 8));
  });
  EXPECT_EQ(count_of(err, "fulgur: warning: WarnsInSetup: from rank zero\n"), 1) << err;
  EXPECT_EQ(count_of(err, "warning: WarnsInSetup: from every rank\n"), 1) << err;
  EXPECT_EQ(count_of(err, "cluster environment"), 1) << err;
}

// A resume into a new version folder: the restored ModelCheckpoint state names the old folder's
// files, which one line reports.
TEST(WarnOnce, ResumeIntoANewVersionFolderPrintsOneLine) {
  TempDir dir;
  {
    TinyRegression m;
    Trainer t(quiet(dir.path).max_epochs(2).callbacks(
        {std::make_shared<ModelCheckpoint>(ModelCheckpointOptions().monitor("val_loss").save_last(true).save_top_k(2))}));
    t.fit(m, loader(32, 8), loader(16, 8));
  }
  const std::string ckpt = dir.path + "/lightning_logs/version_0/checkpoints/last.ckpt";
  ASSERT_TRUE(fs::exists(ckpt));
  TinyRegression m;
  Trainer t(quiet(dir.path).max_epochs(3).callbacks(
      {std::make_shared<ModelCheckpoint>(ModelCheckpointOptions().monitor("val_loss").save_last(true).save_top_k(2))}));
  ::testing::internal::CaptureStderr();
  t.fit(m, loader(32, 8), loader(16, 8), ckpt);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(fs::exists(dir.path + "/lightning_logs/version_1"));
  EXPECT_EQ(count_of(err, "ModelCheckpoint"), 1) << err;
  EXPECT_THAT(err, HasSubstr("the top-k checkpoint '"));
  EXPECT_THAT(err, HasSubstr("the last checkpoint '"));
  EXPECT_THAT(err, HasSubstr("the best checkpoint '"));
}
