// SPDX-License-Identifier: Apache-2.0
// fulgur::lr_scheduler against Python's torch.optim.lr_scheduler on the same steps (Debian's
// python3-torch), and a resumed fit that continues the uninterrupted run's schedule.
#include "support.h"

#include <fulgur/lr_scheduler.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

using namespace fulgur;
using fulgur::testing::read_file;
using fulgur::testing::TempDir;
namespace lrs = fulgur::lr_scheduler;

namespace {

constexpr int kSteps = 12;

// Each schedule of the test, as Python writes it. The optimizer: SGD with two groups (0.1 and
// 0.02, momentum 0.9), so that per-group rates and the momentum OneCycleLR moves are compared too.
const char* const kPython = R"(
import math, sys, warnings, torch
warnings.filterwarnings("ignore")
from torch.optim import lr_scheduler as L
def opt():
    a, b = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2))
    return torch.optim.SGD([{'params': [a]}, {'params': [b], 'lr': 0.02}], lr=0.1, momentum=0.9)
def run(name, make):
    o = opt(); s = make(o); rows = []
    for k in range(13):
        if k: o.step(); s.step()
        rows.append(' '.join(repr(g['lr']) for g in o.param_groups) + ' ' + repr(o.param_groups[0]['momentum']))
    print(name + ': ' + ' | '.join(rows))
run('step', lambda o: L.StepLR(o, step_size=2, gamma=0.5))
run('multistep', lambda o: L.MultiStepLR(o, milestones=[3, 1, 3], gamma=0.3))
run('exponential', lambda o: L.ExponentialLR(o, gamma=0.9))
run('cosine', lambda o: L.CosineAnnealingLR(o, T_max=4, eta_min=0.001))
run('linear', lambda o: L.LinearLR(o, start_factor=0.25, end_factor=1.0, total_iters=4))
run('lambda', lambda o: L.LambdaLR(o, lambda e: 1.0 / (1.0 + e)))
run('onecycle', lambda o: L.OneCycleLR(o, max_lr=0.5, total_steps=12))
run('onecycle3', lambda o: L.OneCycleLR(o, max_lr=[0.5, 0.5], total_steps=12, anneal_strategy='linear', three_phase=True, pct_start=0.25))
run('sequential', lambda o: L.SequentialLR(o, [L.LinearLR(o, start_factor=0.5, total_iters=2), L.ExponentialLR(o, gamma=0.8)], milestones=[3]))
values = [1.0, 0.9, 0.95, 0.95, 0.95, 0.95, 0.8, 0.85, float('nan'), 0.85, 0.85, 0.85, 0.7, 0.75, 0.75, 0.75, 0.75]
for mode, tmode, th in [('min', 'rel', 1e-4), ('min', 'abs', 0.06), ('max', 'rel', 1e-4)]:
    o = opt(); s = L.ReduceLROnPlateau(o, mode=mode, factor=0.5, patience=2, threshold=th, threshold_mode=tmode, cooldown=1, min_lr=0.004)
    rows = []
    for v in values:
        s.step(v if mode == 'min' else -v)
        rows.append(' '.join(repr(g['lr']) for g in o.param_groups) + ' ' + repr(s.num_bad_epochs) + ' ' + repr(s.cooldown_counter))
    print('plateau-' + mode + '-' + tmode + ': ' + ' | '.join(rows))
)";

std::map<std::string, std::vector<std::vector<double>>> python_schedules() {
  TempDir dir;
  std::ofstream(dir.path + "/s.py") << kPython;
  const std::string out = dir.path + "/out.txt";
  EXPECT_EQ(std::system(("/usr/bin/python3 " + dir.path + "/s.py > " + out + " 2>&1").c_str()), 0) << read_file(out);
  std::map<std::string, std::vector<std::vector<double>>> result;
  std::istringstream lines(read_file(out));
  for (std::string line; std::getline(lines, line);) {
    const auto colon = line.find(": ");
    if (colon == std::string::npos) continue;
    std::vector<std::vector<double>> rows;
    std::istringstream parts(line.substr(colon + 2));
    for (std::string part; std::getline(parts, part, '|');) {
      std::istringstream numbers(part);
      std::vector<double> row;
      for (double v; numbers >> v;) row.push_back(v);
      rows.push_back(row);
    }
    result[line.substr(0, colon)] = rows;
  }
  return result;
}

using Maker = std::function<std::shared_ptr<torch::optim::LRScheduler>(torch::optim::SGD&)>;

std::vector<std::vector<double>> ours(const Maker& make) {
  auto a = torch::zeros({2}, torch::requires_grad()), b = torch::zeros({2}, torch::requires_grad());
  std::vector<torch::optim::OptimizerParamGroup> groups{torch::optim::OptimizerParamGroup({a}),
                                                       torch::optim::OptimizerParamGroup(
                                                           {b}, std::make_unique<torch::optim::SGDOptions>(0.02))};
  static_cast<torch::optim::SGDOptions&>(groups[1].options()).momentum(0.9);
  torch::optim::SGD sgd(groups, torch::optim::SGDOptions(0.1).momentum(0.9));
  auto s = make(sgd);
  std::vector<std::vector<double>> rows;
  for (int k = 0; k <= kSteps; ++k) {
    if (k) {
      sgd.step();
      s->step();
    }
    std::vector<double> row;
    for (auto& g : sgd.param_groups()) row.push_back(g.options().get_lr());
    row.push_back(static_cast<torch::optim::SGDOptions&>(sgd.param_groups()[0].options()).momentum());
    rows.push_back(row);
  }
  return rows;
}

}  // namespace

TEST(LrScheduler, EveryScheduleMatchesPythonsStepByStep) {
  const auto python = python_schedules();
  const std::map<std::string, Maker> makers{
      {"step", [](auto& o) { return std::make_shared<lrs::StepLR>(o, 2, 0.5); }},
      {"multistep", [](auto& o) { return std::make_shared<lrs::MultiStepLR>(o, std::vector<int64_t>{3, 1, 3}, 0.3); }},
      {"exponential", [](auto& o) { return std::make_shared<lrs::ExponentialLR>(o, 0.9); }},
      {"cosine", [](auto& o) { return std::make_shared<lrs::CosineAnnealingLR>(o, 4, 0.001); }},
      {"linear", [](auto& o) { return std::make_shared<lrs::LinearLR>(o, 0.25, 1.0, 4); }},
      {"lambda", [](auto& o) { return std::make_shared<lrs::LambdaLR>(o, [](int64_t e) { return 1.0 / (1.0 + e); }); }},
      {"onecycle", [](auto& o) { return std::make_shared<lrs::OneCycleLR>(o, 0.5, 12); }},
      {"onecycle3",
       [](auto& o) {
         return std::make_shared<lrs::OneCycleLR>(
             o, 0.5, 12, lrs::OneCycleOptions().anneal_strategy("linear").three_phase(true).pct_start(0.25));
       }},
      {"sequential", [](auto& o) {
         auto warm = std::make_shared<lrs::LinearLR>(o, 0.5, 1.0, 2);
         auto decay = std::make_shared<lrs::ExponentialLR>(o, 0.8);
         return std::make_shared<lrs::SequentialLR>(o, std::vector<std::shared_ptr<lrs::Schedule>>{warm, decay},
                                                    std::vector<int64_t>{3});
       }}};
  ASSERT_EQ(python.size(), makers.size() + 3) << "Python printed other schedules";
  for (const auto& [name, make] : makers) {
    const auto want = python.at(name);
    const auto got = ours(make);
    ASSERT_EQ(got.size(), want.size()) << name;
    for (size_t k = 0; k < got.size(); ++k) {
      ASSERT_EQ(got[k].size(), want[k].size()) << name << " epoch " << k;
      for (size_t j = 0; j < got[k].size(); ++j)
        EXPECT_NEAR(got[k][j], want[k][j], 1e-12 * std::max(1.0, std::abs(want[k][j])))
            << name << " epoch " << k << (j + 1 == got[k].size() ? " momentum" : " group " + std::to_string(j));
    }
  }
}

TEST(LrScheduler, ReduceLROnPlateauMatchesPythonsStepByStep) {
  const auto python = python_schedules();
  const std::vector<double> values{1.0, 0.9, 0.95, 0.95, 0.95, 0.95, 0.8, 0.85, std::nan(""), 0.85, 0.85, 0.85, 0.7, 0.75, 0.75, 0.75, 0.75};
  for (const auto& [mode, tmode, th] : {std::tuple<std::string, std::string, double>{"min", "rel", 1e-4},
                                        {"min", "abs", 0.06}, {"max", "rel", 1e-4}}) {
    const std::string name = "plateau-" + mode + "-" + tmode;
    auto a = torch::zeros({2}, torch::requires_grad()), b = torch::zeros({2}, torch::requires_grad());
    std::vector<torch::optim::OptimizerParamGroup> groups{
        torch::optim::OptimizerParamGroup({a}),
        torch::optim::OptimizerParamGroup({b}, std::make_unique<torch::optim::SGDOptions>(0.02))};
    torch::optim::SGD sgd(groups, torch::optim::SGDOptions(0.1));
    lrs::ReduceLROnPlateau s(sgd, lrs::ReduceLROnPlateauOptions().mode(mode).factor(0.5).patience(2).threshold(th)
                                      .threshold_mode(tmode).cooldown(1).min_lr(0.004));
    const auto& want = python.at(name);
    ASSERT_EQ(want.size(), values.size()) << name;
    for (size_t k = 0; k < values.size(); ++k) {
      s.step(mode == "min" ? values[k] : -values[k]);
      const std::vector<double> got{sgd.param_groups()[0].options().get_lr(), sgd.param_groups()[1].options().get_lr(),
                                    static_cast<double>(s.num_bad_epochs()), static_cast<double>(s.cooldown_counter())};
      for (size_t j = 0; j < got.size(); ++j) EXPECT_NEAR(got[j], want[k][j], 1e-12) << name << " step " << k << " column " << j;
    }
  }
}

TEST(LrScheduler, ValuesPythonRefusesAreRefusedNamingThem) {
  auto p = torch::zeros({1}, torch::requires_grad());
  torch::optim::SGD sgd({p}, torch::optim::SGDOptions(0.1));
  auto refused = [](const std::function<void()>& f, const std::string& needle) {
    try {
      f();
      ADD_FAILURE() << "accepted: " << needle;
    } catch (const std::invalid_argument& e) {
      EXPECT_THAT(e.what(), ::testing::HasSubstr(needle));
    }
  };
  refused([&] { lrs::StepLR(sgd, 0); }, "step_size=0");
  refused([&] { lrs::LinearLR(sgd, 0.0); }, "start_factor=0");
  refused([&] { lrs::CosineAnnealingLR(sgd, 0); }, "T_max=0");
  refused([&] { lrs::OneCycleLR(sgd, 0.1, 10, lrs::OneCycleOptions().anneal_strategy("exp")); }, "anneal_strategy='exp'");
  refused([&] { lrs::MultiStepLR(sgd, {-1}); }, "milestone -1");
  lrs::OneCycleLR one(sgd, 0.1, 2);
  one.step();
  one.step();
  refused([&] { one.step(); }, "tried to step 3 times; the specified number of total steps is 2");
  auto step = std::make_shared<lrs::StepLR>(sgd, 2);
  torch::optim::SGD other({p}, torch::optim::SGDOptions(0.1));
  refused([&] { lrs::SequentialLR(other, {step}, {}); }, "drives another optimizer");
  refused([&] { lrs::SequentialLR(sgd, {step}, {3}); }, "1 schedulers need 0 milestones");
}

namespace {

// Writes each epoch's first learning rate to `lr_log` ("epoch rate" lines).
struct LoggingLr : fulgur::testing::TinyRegression {
  explicit LoggingLr(std::string lr_log) : TinyRegression(0.1), log_path(std::move(lr_log)) {}
  std::string log_path;
  void on_train_epoch_start() override {
    auto& opt = *trainer()->strategy().optimizer_config().optimizers.front();
    std::ofstream(log_path, std::ios::app) << trainer()->current_epoch() << " "
                                           << opt.param_groups()[0].options().get_lr() << "\n";
  }
};

// SGD under a cosine schedule stepped per epoch.
struct Scheduled : LoggingLr {
  using LoggingLr::LoggingLr;
  OptimizerConfig configure_optimizers() override {
    auto sgd = std::make_shared<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.1));
    auto cosine = std::make_shared<lrs::CosineAnnealingLR>(*sgd, 4, 0.01);
    return OptimizerConfig({sgd}, {SchedulerConfig(cosine)});
  }
};

// SGD with a ReduceLROnPlateau on `monitor`, stepped per epoch.
struct Plateau : LoggingLr {
  Plateau(std::string lr_log, std::string monitor, bool strict)
      : LoggingLr(std::move(lr_log)), monitor(std::move(monitor)), strict(strict) {}
  std::string monitor;
  bool strict;
  OptimizerConfig configure_optimizers() override {
    auto sgd = std::make_shared<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.1));
    auto p = std::make_shared<lrs::ReduceLROnPlateau>(
        *sgd, lrs::ReduceLROnPlateauOptions().patience(0).factor(0.5).threshold(0.5));
    return OptimizerConfig({sgd}, {SchedulerConfig(p).monitor(monitor).strict(strict)});
  }
};

// `epochs` epochs of `model` (from ckpt when given) with last.ckpt in <dir>/ck and a validation
// loader when `validate`; the weight it ends with.
at::Tensor fit(LoggingLr& model, const std::string& dir, int64_t epochs, const std::string& ckpt, bool validate) {
  auto data = [] {
    return std::make_shared<DataLoader>(fulgur::testing::regression_data(32), DataLoaderOptions(8).shuffle(true).seed(2));
  };
  Trainer t(TrainerOptions().accelerator("cpu").devices(1).max_epochs(epochs).default_root_dir(dir).logger(false)
                .enable_progress_bar(false).enable_model_summary(false).num_sanity_val_steps(0)
                .callbacks({std::make_shared<ModelCheckpoint>(ModelCheckpointOptions().dirpath(dir + "/ck").save_last(true))}));
  t.fit(model, data(), validate ? data() : nullptr, ckpt);
  return model.fc->weight.detach().clone();
}

at::Tensor fit_cosine(const std::string& dir, int64_t epochs, const std::string& ckpt) {
  torch::manual_seed(5);
  Scheduled m(dir + "/lr.txt");
  return fit(m, dir, epochs, ckpt, false);
}

at::Tensor fit_plateau(const std::string& dir, int64_t epochs, const std::string& ckpt,
                       const std::string& monitor = "val_loss", bool strict = true) {
  std::filesystem::create_directories(dir);
  torch::manual_seed(5);
  Plateau m(dir + "/lr.txt", monitor, strict);
  return fit(m, dir, epochs, ckpt, true);
}

}  // namespace

TEST(LrScheduler, AResumedFitContinuesTheScheduleOfTheUninterruptedOne) {
  TempDir full, part;
  const at::Tensor want = fit_cosine(full.path, 6, "");
  fit_cosine(part.path, 3, "");
  const at::Tensor got = fit_cosine(part.path, 6, part.path + "/ck/last.ckpt");
  EXPECT_EQ(read_file(part.path + "/lr.txt"), read_file(full.path + "/lr.txt"));
  // Python's CosineAnnealingLR(T_max=4, eta_min=0.01) from 0.1, one value per epoch.
  std::ostringstream python_values;
  for (int e = 0; e < 6; ++e) python_values << e << " " << 0.01 + 0.09 * (1 + std::cos(M_PI * e / 4)) / 2 << "\n";
  EXPECT_EQ(read_file(full.path + "/lr.txt"), python_values.str());
  EXPECT_TRUE(torch::equal(got, want)) << got << "\n" << want;
}

// The plateau's rate follows val_loss (threshold 0.5, patience 0: it halves whenever val_loss
// did not halve), and a resumed fit takes the step the interrupted epoch still owed.
TEST(LrScheduler, ReduceLROnPlateauFollowsTheMonitoredMetricAndResumes) {
  TempDir full, part;
  const at::Tensor want = fit_plateau(full.path, 6, "");
  fit_plateau(part.path, 3, "");
  const at::Tensor got = fit_plateau(part.path, 6, part.path + "/ck/last.ckpt");
  const std::string lrs_full = read_file(full.path + "/lr.txt");
  EXPECT_EQ(read_file(part.path + "/lr.txt"), lrs_full);
  EXPECT_NE(lrs_full.find(" 0.05\n"), std::string::npos) << "the rate never dropped: " << lrs_full;
  EXPECT_TRUE(torch::equal(got, want)) << got << "\n" << want;
}

TEST(LrScheduler, ReduceLROnPlateauNeedsAMonitorAndALoggedMetric) {
  TempDir dir;
  try {
    fit_plateau(dir.path + "/a", 1, "", "");
    ADD_FAILURE() << "no monitor accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("needs the metric it follows"));
  }
  try {
    fit_plateau(dir.path + "/b", 1, "", "val_acc");
    ADD_FAILURE() << "a metric never logged accepted";
  } catch (const std::exception& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("follows 'val_acc', which is not logged"));
    EXPECT_THAT(e.what(), ::testing::HasSubstr("val_loss"));
  }
  fit_plateau(dir.path + "/c", 2, "", "val_acc", /*strict=*/false);  // skipped with a warning
  EXPECT_EQ(read_file(dir.path + "/c/lr.txt"), "0 0.1\n1 0.1\n");
}
