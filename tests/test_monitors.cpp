// SPDX-License-Identifier: Apache-2.0
// ThroughputMonitor and DeviceStatsMonitor: what they log, and the FLOPs XLA's cost analysis
// gives a compiled training step against a hand count.
#include <fulgur/fulgur.h>
#include <fulgur/xla/backend.h>
#include <gtest/gtest.h>

#include "support.h"

#include <cmath>
#include <cstdio>

using namespace fulgur;
using fulgur::testing::regression_data;
using fulgur::testing::TempDir;
using fulgur::testing::TinyRegression;

namespace {

// Every row the Trainer and the callbacks log, in order.
struct RecordingLogger : Logger {
  std::string name() const override { return "recording"; }
  std::string version() override { return "0"; }
  std::string log_dir() override { return dir; }
  void log_metrics(const std::map<std::string, double>& metrics, int64_t step) override {
    rows.emplace_back(step, metrics);
  }
  void log_hyperparams(const c10::Dict<std::string, c10::IValue>&) override {}
  void save() override {}
  void finalize(const std::string&) override {}
  // The rows that have `key`, as (step, value).
  std::vector<std::pair<int64_t, double>> series(const std::string& key) const {
    std::vector<std::pair<int64_t, double>> out;
    for (const auto& [step, m] : rows)
      if (auto it = m.find(key); it != m.end()) out.emplace_back(step, it->second);
    return out;
  }
  std::string dir;
  std::vector<std::pair<int64_t, std::map<std::string, double>>> rows;
};

TrainerOptions quiet(const std::string& dir, const std::shared_ptr<RecordingLogger>& logger) {
  logger->dir = dir;
  return fulgur::testing::quiet_cpu_options(dir).enable_checkpointing(false).log_every_n_steps(1).logger(logger);
}

// Linear(in, hidden), ReLU, Linear(hidden, out) on a mean squared error, plain SGD.
struct Mlp : LightningModule {
  Mlp(int64_t in, int64_t hidden, int64_t out) : LightningModule("Mlp") {
    fc1 = register_module("fc1", torch::nn::Linear(in, hidden));
    fc2 = register_module("fc2", torch::nn::Linear(hidden, out));
  }
  StepOutput training_step(const Batch& b, int64_t) override {
    auto y = fc2->forward(torch::relu(fc1->forward(b.data)));
    return torch::mse_loss(y, b.target);
  }
  OptimizerConfig configure_optimizers() override {
    return OptimizerConfig(std::make_shared<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.01)));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};

}  // namespace

TEST(ThroughputMonitor, LogsTotalsAndWindowRatesAsLightning) {
  TempDir dir;
  auto logger = std::make_shared<RecordingLogger>();
  auto monitor = std::make_shared<ThroughputMonitor>(
      ThroughputMonitorOptions().window_size(3).length_fn([](const Batch& b) { return b.data.size(1); }));
  TinyRegression model;
  Trainer trainer(quiet(dir.path, logger).max_epochs(2).callbacks({monitor}));
  trainer.fit(model, std::make_shared<DataLoader>(regression_data(40), DataLoaderOptions(8)),
              std::make_shared<DataLoader>(regression_data(16), DataLoaderOptions(8)));
  // 5 batches of 8 a epoch, a row each (log_every_n_steps 1).
  const auto samples = logger->series("train/samples");
  ASSERT_EQ(samples.size(), 10u);
  for (size_t i = 0; i < samples.size(); ++i) {
    EXPECT_EQ(samples[i].first, static_cast<int64_t>(i + 1));
    EXPECT_EQ(samples[i].second, 8.0 * static_cast<double>(i + 1));
  }
  EXPECT_EQ(logger->series("train/batches").back().second, 10.0);
  EXPECT_EQ(logger->series("train/lengths").back().second, 10.0 * 8);  // 8 features a sample, summed over batches
  const auto time = logger->series("train/time");
  for (size_t i = 1; i < time.size(); ++i) EXPECT_GT(time[i].second, time[i - 1].second) << i;
  // Rates once the window of 3 batches is full: from the third batch on.
  const auto rate = logger->series("train/device/samples_per_sec");
  const auto batches_rate = logger->series("train/device/batches_per_sec");
  const auto items_rate = logger->series("train/device/items_per_sec");
  ASSERT_EQ(rate.size(), 8u);
  EXPECT_EQ(rate.front().first, 3);
  ASSERT_EQ(batches_rate.size(), 8u);
  ASSERT_EQ(items_rate.size(), 8u);
  for (size_t i = 0; i < rate.size(); ++i) {
    EXPECT_GT(rate[i].second, 0.0);
    EXPECT_NEAR(rate[i].second, 8 * batches_rate[i].second, 1e-9 * rate[i].second);
    EXPECT_NEAR(items_rate[i].second, 8 * rate[i].second, 1e-9 * items_rate[i].second);
  }
  // One process: no global rates; no FLOPs on the CPU without flops_per_batch.
  EXPECT_TRUE(logger->series("train/samples_per_sec").empty());
  EXPECT_TRUE(logger->series("train/device/flops_per_sec").empty());
  EXPECT_LT(monitor->last_batch_flops(), 0.0);
}

TEST(ThroughputMonitor, GivenFlopsGiveFlopsPerSecondAndMfu) {
  TempDir dir;
  auto logger = std::make_shared<RecordingLogger>();
  auto monitor = std::make_shared<ThroughputMonitor>(
      ThroughputMonitorOptions().window_size(2).flops_per_batch(1e6).available_flops(1e9));
  TinyRegression model;
  Trainer trainer(quiet(dir.path, logger).max_epochs(1).callbacks({monitor}));
  trainer.fit(model, std::make_shared<DataLoader>(regression_data(32), DataLoaderOptions(8)));
  const auto flops = logger->series("train/device/flops_per_sec");
  const auto batches = logger->series("train/device/batches_per_sec");
  const auto mfu = logger->series("train/device/mfu");
  ASSERT_EQ(flops.size(), 3u);
  ASSERT_EQ(mfu.size(), 3u);
  for (size_t i = 0; i < flops.size(); ++i) {
    EXPECT_NEAR(flops[i].second, 1e6 * batches[i].second, 1e-9 * flops[i].second);
    EXPECT_NEAR(mfu[i].second, flops[i].second / 1e9, 1e-12);
  }
}

TEST(ThroughputMonitor, BadOptionsAreErrorsNamingTheValue) {
  auto message = [](const ThroughputMonitorOptions& o) {
    try {
      ThroughputMonitor m(o);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message(ThroughputMonitorOptions().window_size(1)).find("window_size=1 must be >= 2"), std::string::npos);
  EXPECT_NE(message(ThroughputMonitorOptions().flops_per_batch(0)).find("flops_per_batch=0"), std::string::npos);
  EXPECT_NE(message(ThroughputMonitorOptions().available_flops(-1)).find("available_flops=-1"), std::string::npos);
  EXPECT_NE(message(ThroughputMonitorOptions().separator("")).find("separator"), std::string::npos);
}

// On xla the FLOPs of a step come from XLA's cost analysis of the programs it ran. The MLP's
// matrix products, counted by hand at two FLOPs a multiply-add: forward x·W1 and h·W2, backward
// dW2, dh and dW1 (no gradient for the input). Everything else (bias, ReLU, the loss, SGD's
// update) is elementwise work on a few percent of that.
TEST(ThroughputMonitor, OnXlaTheFlopsOfAStepAreXlasCostAnalysisAndMatchAHandCount) {
  const int64_t batch = 32, in = 256, hidden = 256, out = 64;
  TempDir dir;
  auto logger = std::make_shared<RecordingLogger>();
  auto monitor = std::make_shared<ThroughputMonitor>(ThroughputMonitorOptions().window_size(3));
  torch::manual_seed(0);
  Mlp model(in, hidden, out);
  auto data = std::make_shared<TensorDataset>(torch::randn({batch * 6, in}), torch::randn({batch * 6, out}));
  Trainer trainer(quiet(dir.path, logger).accelerator("xla").max_epochs(1).callbacks({monitor}));
  trainer.fit(model, std::make_shared<DataLoader>(data, DataLoaderOptions(batch)));
  const double matmuls = 2.0 * batch * (in * hidden + hidden * out) + 2.0 * batch * (2 * hidden * out + in * hidden);
  const double measured = monitor->last_batch_flops();
  ASSERT_GT(measured, 0.0) << xla::metrics_report();
  std::printf("a step's FLOPs by XLA's cost analysis: %.0f; its matrix products by hand: %.0f\n", measured, matmuls);
  EXPECT_GE(measured, matmuls);
  EXPECT_LE(measured, 1.10 * matmuls) << "hand count " << matmuls;
  const auto flops = logger->series("train/device/flops_per_sec");
  const auto batches = logger->series("train/device/batches_per_sec");
  ASSERT_FALSE(flops.empty());
  // The window's FLOPs over its time: the steps' FLOPs times the batch rate, every step alike.
  EXPECT_NEAR(flops.back().second, measured * batches.back().second, 1e-6 * flops.back().second);
  EXPECT_GT(xla::metrics().xla_executed_flops, 5 * matmuls);
}

TEST(DeviceStatsMonitor, LogsTheHostsStatisticsOnTheCpu) {
  TempDir dir;
  auto logger = std::make_shared<RecordingLogger>();
  auto monitor = std::make_shared<DeviceStatsMonitor>();
  TinyRegression model;
  Trainer trainer(quiet(dir.path, logger).max_epochs(1).log_every_n_steps(2).callbacks({monitor}));
  trainer.fit(model, std::make_shared<DataLoader>(regression_data(32), DataLoaderOptions(8)));
  const std::string p = "DeviceStatsMonitor.on_train_batch_end/";
  const auto vm = logger->series(p + "cpu_vm_percent");
  ASSERT_EQ(vm.size(), 2u);  // steps 2 and 4 of 4
  EXPECT_EQ(vm[0].first, 2);
  EXPECT_EQ(vm[1].first, 4);
  for (const auto& [step, v] : vm) {
    EXPECT_GT(v, 0.0);
    EXPECT_LE(v, 100.0);
  }
  const auto rss = logger->series(p + "process_rss_bytes");
  ASSERT_EQ(rss.size(), 2u);
  EXPECT_GT(rss[0].second, 1e6);  // a process that loaded libtorch holds more than a megabyte
  EXPECT_GE(logger->series(p + "process_peak_rss_bytes")[0].second, rss[0].second);
  const auto cpu = logger->series(p + "cpu_percent");
  ASSERT_EQ(cpu.size(), 2u);
  EXPECT_GE(cpu[1].second, 0.0);
  EXPECT_LE(cpu[1].second, 100.0);
}

// The CPU plugin has no allocator statistics: its device memory is the host's, which is what
// an xla device on it reports. A plugin that has them gives bytes_in_use at least.
TEST(DeviceStatsMonitor, OnXlaLogsThePluginsStatisticsOrTheHostsWhereItHasNone) {
  TempDir dir;
  auto logger = std::make_shared<RecordingLogger>();
  auto monitor = std::make_shared<DeviceStatsMonitor>(/*cpu_stats=*/true);
  TinyRegression model;
  Trainer trainer(quiet(dir.path, logger).accelerator("xla").max_epochs(1).callbacks({monitor}));
  trainer.fit(model, std::make_shared<DataLoader>(regression_data(16), DataLoaderOptions(8)));
  const auto device = xla::backend().device_memory_stats();
  const std::string p = "DeviceStatsMonitor.on_train_batch_end/";
  ASSERT_FALSE(monitor->last_stats().empty());
  EXPECT_EQ(logger->series(p + "process_rss_bytes").size(), 2u);  // the host's, with cpu_stats
  if (!device.empty()) {
    EXPECT_EQ(logger->series(p + "bytes_in_use").size(), 2u);
  }
}
