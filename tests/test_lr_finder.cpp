// SPDX-License-Identifier: Apache-2.0
// The learning-rate range test: lr_find before fit, and LearningRateFinder inside fit on the cpu,
// on xla and with two real processes.
#include "support.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

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

// The weights of `a` and `b` agree name by name, bit for bit.
void expect_same(const Weights& a, const Weights& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first) << what;
    EXPECT_TRUE(torch::equal(a[i].second, b[i].second)) << what << ": " << a[i].first;
  }
}

}  // namespace

namespace {

std::vector<std::string> lines_of(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

}  // namespace

// Rates from 1e-5 up to 0.1 over 40 steps: no divergence, so 40 points, rising exponentially to
// max_lr; the weights come back bit for bit and the CSV holds the curve.
TEST(LRFinder, CurveWithoutDivergenceAndWeightsRestored) {
  TempDir dir;
  seed_everything(3);
  TinyRegression m(0.1);
  const Weights before = weights_of(m);
  Trainer t(quiet(dir.path).max_epochs(1));
  const LRFinderResult r =
      lr_find(t, m, loader(256, 8), LRFinderOptions().min_lr(1e-5).max_lr(0.1).num_training(40));
  expect_same(weights_of(m), before, "the weights after lr_find");
  ASSERT_EQ(r.lrs.size(), 40u);
  ASSERT_EQ(r.losses.size(), 40u);
  EXPECT_DOUBLE_EQ(r.lrs.front(), 1e-5);
  EXPECT_NEAR(r.lrs.back(), 0.1, 1e-12);
  EXPECT_NEAR(r.lrs[1], 1e-5 * std::pow(1e4, 2.0 / 40), 1e-15);
  for (size_t i = 1; i < r.lrs.size(); ++i) EXPECT_GT(r.lrs[i], r.lrs[i - 1]);
  for (double loss : r.losses) EXPECT_TRUE(std::isfinite(loss));
  EXPECT_EQ(r.csv_path, dir.path + "/lr_find.csv");
  const auto rows = lines_of(r.csv_path);
  ASSERT_EQ(rows.size(), 41u);
  EXPECT_EQ(rows[0], "step,lr,loss");
  EXPECT_EQ(rows[1].rfind("0,1.0000000000000001e-05,", 0), 0u) << rows[1];
  EXPECT_FALSE(fs::exists(dir.path + "/lightning_logs")) << "the range test logs nothing";
}

// From 1e-6 to 10 the loss of this least-squares problem diverges (gradient descent on its full
// batch is unstable above about 1): the test stops early, and the suggestion lies where the
// smoothed loss falls fastest against log10(lr), well below that and well above min_lr.
TEST(LRFinder, SuggestionOnARegressionProblemAndEarlyStop) {
  TempDir dir;
  seed_everything(3);
  TinyRegression m(0.1);
  Trainer t(quiet(dir.path));
  const LRFinderResult r = lr_find(t, m, loader(64, 64),
                                   LRFinderOptions().min_lr(1e-6).max_lr(10).num_training(100).csv_path(dir.path + "/c.csv"));
  EXPECT_LT(r.lrs.size(), 100u) << "diverged before max_lr";
  EXPECT_GT(r.lrs.size(), 50u);
  EXPECT_GT(r.losses.back(), 4 * *std::min_element(r.losses.begin(), r.losses.end()));
  const auto s = r.suggestion();
  ASSERT_TRUE(s.has_value());
  EXPECT_GT(*s, 1e-3);
  EXPECT_LT(*s, 1.0);
  EXPECT_EQ(lines_of(dir.path + "/c.csv").size(), r.lrs.size() + 1);
  // Too few points left after the skipped ones: no suggestion.
  EXPECT_FALSE(r.suggestion(static_cast<int64_t>(r.lrs.size()) - 2, 1).has_value());
  EXPECT_THAT([&] { lr_find(t, m, loader(64, 8), LRFinderOptions().mode("cosine")); },
              ::testing::ThrowsMessage<std::invalid_argument>(HasSubstr("mode 'cosine' is not known")));
  EXPECT_THAT([&] { lr_find(t, m, loader(64, 8), LRFinderOptions().min_lr(1).max_lr(0.5)); },
              ::testing::ThrowsMessage<std::invalid_argument>(HasSubstr("max_lr=0.500000 must be greater than min_lr")));
}

namespace {

void set_tiny_lr(LightningModule& m, double lr) { static_cast<TinyRegression&>(m).lr = lr; }

// What the real training starts from, after LearningRateFinder's on_fit_start: the weights and
// the rate of the optimizer's first group; and the weights after fit.
struct TrainStart : Callback {
  std::string state_key() const override { return "TrainStart"; }
  void on_train_start(Trainer& t, LightningModule& m) override {
    weights = weights_of(m);
    lr = t.optimizer_config().optimizers.at(0)->param_groups().at(0).options().get_lr();
    steps_at_start = t.global_step();
  }
  Weights weights;
  double lr = 0;
  int64_t steps_at_start = -1;
};

LearningRateFinderOptions finder_options() {
  return LearningRateFinderOptions().min_lr(1e-4).max_lr(1.0).num_training_steps(30);
}

}  // namespace

// The test runs at fit start; the real training then starts from the weights the module had
// (bit for bit), at step 0, with the suggestion as the module's rate, and ends exactly where a
// plain fit with that rate from the same weights ends.
TEST(LearningRateFinder, TrainsFromTheOriginalWeightsWithTheSuggestion) {
  TempDir dir;
  seed_everything(3);
  TinyRegression m(0.1);
  const Weights before = weights_of(m);
  auto finder = std::make_shared<LearningRateFinder>(finder_options(), set_tiny_lr);
  auto start = std::make_shared<TrainStart>();
  Trainer t(quiet(dir.path).max_steps(12).logger(false).enable_checkpointing(false).callbacks({finder, start}));
  t.fit(m, loader(128, 8));
  ASSERT_TRUE(finder->optimal_lr().has_value());
  const double found = *finder->optimal_lr();
  EXPECT_EQ(finder->result().lrs.size(), 30u);
  EXPECT_GT(found, 1e-4);
  EXPECT_LT(found, 1.0);
  EXPECT_EQ(m.lr, found);
  EXPECT_EQ(start->lr, found);
  EXPECT_EQ(start->steps_at_start, 0);
  expect_same(start->weights, before, "the weights the training starts from");
  EXPECT_EQ(t.global_step(), 12);
  EXPECT_TRUE(fs::exists(dir.path + "/lr_find.csv"));

  TinyRegression plain(found);
  {
    torch::NoGradGuard no_grad;
    for (const auto& [name, w] : before) plain.named_parameters()[name].copy_(w);
  }
  Trainer t2(quiet(dir.path).max_steps(12).logger(false).enable_checkpointing(false));
  t2.fit(plain, loader(128, 8));
  expect_same(weights_of(m), weights_of(plain), "after fit, against a plain fit with the found rate");
}

// Without a setter the optimizers' groups take the rate; with update_attr(false) nothing changes;
// bad options name the option.
TEST(LearningRateFinder, WithoutSetterOrUpdateAndBadOptions) {
  TempDir dir;
  for (const bool update : {true, false}) {
    seed_everything(3);
    TinyRegression m(0.1);
    auto finder = std::make_shared<LearningRateFinder>(finder_options().update_attr(update));
    auto start = std::make_shared<TrainStart>();
    Trainer t(quiet(dir.path).max_steps(2).logger(false).enable_checkpointing(false).callbacks({finder, start}));
    t.fit(m, loader(128, 8));
    ASSERT_TRUE(finder->optimal_lr().has_value());
    EXPECT_EQ(m.lr, 0.1);
    EXPECT_EQ(start->lr, update ? *finder->optimal_lr() : 0.1) << "update_attr=" << update;
  }
  EXPECT_THAT([] { LearningRateFinder(LearningRateFinderOptions().num_training_steps(0)); },
              ::testing::ThrowsMessage<std::invalid_argument>(HasSubstr("num_training_steps=0 must be >= 1")));
  EXPECT_THAT([] { LearningRateFinder(LearningRateFinderOptions().mode("cosine")); },
              ::testing::ThrowsMessage<std::invalid_argument>(HasSubstr("LearningRateFinder: mode 'cosine' is not known")));
}

// A resumed fit runs no test: the rate comes back from the checkpoint, to the setter too.
TEST(LearningRateFinder, AResumedFitKeepsTheRateFound) {
  TempDir dir;
  seed_everything(3);
  TinyRegression m(0.1);
  auto finder = std::make_shared<LearningRateFinder>(finder_options(), set_tiny_lr);
  const std::string ck = dir.path + "/ck";
  auto checkpoints = [&] { return std::make_shared<ModelCheckpoint>(ModelCheckpointOptions().dirpath(ck).save_last(true)); };
  Trainer t(quiet(dir.path).max_steps(3).logger(false).callbacks({finder, checkpoints()}));
  t.fit(m, loader(128, 8));
  ASSERT_TRUE(finder->optimal_lr().has_value());
  TinyRegression resumed(0.1);
  auto again = std::make_shared<LearningRateFinder>(finder_options(), set_tiny_lr);
  Trainer t2(quiet(dir.path).max_steps(5).logger(false).callbacks({again, checkpoints()}));
  t2.fit(resumed, loader(128, 8), nullptr, ck + "/last.ckpt");
  EXPECT_TRUE(again->result().lrs.empty()) << "no second test";
  EXPECT_EQ(again->optimal_lr(), finder->optimal_lr());
  EXPECT_EQ(resumed.lr, *finder->optimal_lr());
  EXPECT_EQ(t2.global_step(), 5);
}

namespace {

// Each rank writes the rate it found and its weights after fit to <dir>/rank-<R>.pt.
struct RankReport : Callback {
  RankReport(std::string dir, std::shared_ptr<LearningRateFinder> finder) : dir(std::move(dir)), finder(std::move(finder)) {}
  std::string state_key() const override { return "RankReport"; }
  void on_fit_end(Trainer& t, LightningModule& m) override {
    std::vector<at::Tensor> out{torch::tensor({finder->optimal_lr().value_or(-1.0)}, torch::kFloat64),
                                torch::tensor({t.global_step()})};
    for (auto& [name, w] : weights_of(m)) out.push_back(w);
    torch::save(out, dir + "/rank-" + std::to_string(t.global_rank()) + ".pt");
  }
  std::string dir;
  std::shared_ptr<LearningRateFinder> finder;
};

// Two real processes (ddp on the cpu, xla's strategy on two xla devices): both ranks run the test
// on their shares in lockstep, find the same rate and train to the same weights.
void expect_two_processes_find_the_same_rate(const std::string& accelerator, const std::string& strategy) {
  SCOPED_TRACE(strategy);
  TempDir dir;
  seed_everything(3);
  TinyRegression m(0.1);
  auto finder = std::make_shared<LearningRateFinder>(finder_options().num_training_steps(20), set_tiny_lr);
  Trainer t(quiet(dir.path).accelerator(accelerator).strategy(strategy).devices(2).max_steps(3).logger(false)
                .enable_checkpointing(false).callbacks({finder, std::make_shared<RankReport>(dir.path, finder)}));
  t.fit(m, loader(128, 8));
  std::vector<at::Tensor> r0, r1;
  torch::load(r0, dir.path + "/rank-0.pt");
  torch::load(r1, dir.path + "/rank-1.pt");
  ASSERT_EQ(r0.size(), r1.size());
  const double rate = r0[0].item<double>();
  EXPECT_GT(rate, 1e-4);
  EXPECT_LT(rate, 1.0);
  EXPECT_EQ(r1[0].item<double>(), rate) << "rank 1's rate";
  EXPECT_EQ(r0[1].item<int64_t>(), 3);
  EXPECT_EQ(r1[1].item<int64_t>(), 3);
  for (size_t i = 2; i < r0.size(); ++i) EXPECT_TRUE(torch::equal(r0[i], r1[i])) << "weights " << i;
  EXPECT_EQ(finder->optimal_lr(), rate) << "rank 0's, back in the launching process";
  EXPECT_EQ(m.lr, 0.1) << "the setter ran in the workers";
  EXPECT_TRUE(fs::exists(dir.path + "/lr_find.csv"));
}

}  // namespace

TEST(LearningRateFinder, TwoProcessesFindTheSameRate) {
  expect_two_processes_find_the_same_rate("cpu", "ddp");
  expect_two_processes_find_the_same_rate("xla", "xla");
}

// On an xla device: the weights come back from the device bit for bit, and training goes on.
// (Last in the file: this process then holds a PJRT client, which forked xla workers cannot use.)
TEST(LearningRateFinder, OnXla) {
  TempDir dir;
  seed_everything(3);
  TinyRegression m(0.1);
  const Weights before = weights_of(m);
  auto finder = std::make_shared<LearningRateFinder>(finder_options().num_training_steps(20), set_tiny_lr);
  auto start = std::make_shared<TrainStart>();
  Trainer t(quiet(dir.path).accelerator("xla").devices(1).max_steps(3).logger(false).enable_checkpointing(false)
                .callbacks({finder, start}));
  t.fit(m, loader(64, 8));
  ASSERT_TRUE(finder->optimal_lr().has_value());
  EXPECT_EQ(finder->result().lrs.size(), 20u);
  EXPECT_EQ(m.lr, *finder->optimal_lr());
  EXPECT_EQ(start->lr, *finder->optimal_lr());
  expect_same(start->weights, before, "the weights the training starts from");
  EXPECT_EQ(t.global_step(), 3);
  EXPECT_FALSE(torch::equal(weights_of(m)[0].second, before[0].second)) << "training went on";
}
