// xla devices on the torch::lazy backend with PJRT (FULGUR_XLA_BACKEND=pjrt): graphs emitted as
// StableHLO, compiled and run by the real XLA CPU plugin, give the CPU's losses and parameters;
// XLA compiles stop after warm-up; a graph with an op the emitter does not know runs on
// TorchScript, counted and warned about once by name. Each test runs in its own process
// (CTest), so the backend starts fresh from the environment each test sets.

#include "support.h"

#include <fulgur/xla/backend.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <regex>

using namespace fulgur;
using fulgur::testing::regression_data;
using fulgur::testing::TempDir;
using ::testing::HasSubstr;

namespace {

// Linear + ReLU + Linear, squared error, Adam; `with_cos` puts aten::cos (and its backward's
// aten::sin) in the graph, ops outside the emitter's set.
struct Mlp : LightningModule {
  explicit Mlp(bool with_cos) : LightningModule("Mlp"), with_cos(with_cos) {
    fc1 = register_module("fc1", torch::nn::Linear(8, 16));
    fc2 = register_module("fc2", torch::nn::Linear(16, 1));
  }
  StepOutput training_step(const Batch& b, int64_t) override {
    auto h = torch::relu(fc1->forward(b.data));
    if (with_cos) h = torch::cos(h);
    auto d = fc2->forward(h) - b.target;
    return (d * d).mean();
  }
  void on_train_batch_end(const StepOutput& out, const Batch&, int64_t) override {
    losses.push_back(out.loss().item<double>());
    xla_graphs_after_step.push_back(xla::metrics().xla_graphs_compiled);
  }
  OptimizerConfig configure_optimizers() override {
    return std::make_shared<torch::optim::Adam>(parameters(), torch::optim::AdamOptions(1e-2));
  }
  bool with_cos;
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  std::vector<double> losses;
  std::vector<int64_t> xla_graphs_after_step;
};

struct TrainRun {
  std::shared_ptr<Mlp> net;
  std::string stderr_text;
};

// 20 steps of 8 samples on `accelerator`, the same initial weights every time.
TrainRun train(const std::string& accelerator, bool with_cos = false) {
  TempDir dir;
  torch::manual_seed(7);
  TrainRun r{std::make_shared<Mlp>(with_cos), ""};
  Trainer t(TrainerOptions()
                .accelerator(accelerator)
                .devices(1)
                .max_epochs(1)
                .default_root_dir(dir.path)
                .enable_progress_bar(false)
                .enable_checkpointing(false)
                .num_sanity_val_steps(0));
  auto data = std::make_shared<DataLoader>(regression_data(160), DataLoaderOptions(8));
  ::testing::internal::CaptureStderr();
  try {
    t.fit(*r.net, data);
  } catch (...) {
    r.stderr_text = ::testing::internal::GetCapturedStderr();
    throw;
  }
  r.stderr_text = ::testing::internal::GetCapturedStderr();
  return r;
}

void expect_same(const TrainRun& cpu, const TrainRun& xla) {
  ASSERT_EQ(cpu.net->losses.size(), 20u);
  ASSERT_EQ(xla.net->losses.size(), cpu.net->losses.size());
  for (size_t i = 0; i < cpu.net->losses.size(); ++i) {
    EXPECT_NEAR(xla.net->losses[i], cpu.net->losses[i], 1e-4) << "step " << i;
  }
  auto a = cpu.net->named_parameters(), b = xla.net->named_parameters();
  for (const auto& p : a) {
    ASSERT_TRUE(b[p.key()].device().is_cpu()) << p.key();
    EXPECT_LE((b[p.key()] - p.value()).abs().max().item<double>(), 1e-4) << p.key();
  }
}

}  // namespace

TEST(XlaPjrt, MlpTrainsWithTheEagerLossesAndParameters) {
  setenv("FULGUR_XLA_BACKEND", "pjrt", 1);
  TrainRun cpu = train("cpu");
  TrainRun xla = train("xla");
  expect_same(cpu, xla);
  EXPECT_EQ(xla::backend().name(), "pjrt");
  const auto m = xla::metrics();
  EXPECT_TRUE(m.xla_fallbacks.empty()) << xla::metrics_report();
  EXPECT_GT(m.xla_graphs_compiled, 0);
  EXPECT_GE(m.xla_executions, 40);  // at least a forward/backward and an optimizer graph per step
  EXPECT_GT(m.bytes_to_device, 0);
  EXPECT_GT(m.bytes_to_host, 0);
  EXPECT_GT(m.xla_compile_seconds, 0.0);
  const auto& g = xla.net->xla_graphs_after_step;
  ASSERT_EQ(g.size(), 20u);
  EXPECT_EQ(g.back(), g[4]) << "XLA was still compiling graphs after warm-up";
  const std::string report = xla::metrics_report();
  EXPECT_THAT(report, HasSubstr("backend: pjrt"));
  EXPECT_THAT(report, HasSubstr("xla graphs compiled: " + std::to_string(m.xla_graphs_compiled)));
  EXPECT_THAT(report, HasSubstr("graphs kept on TorchScript, by op: none"));
  EXPECT_EQ(m.ts_fallback_executions, 0);
  std::printf("%s", report.c_str());
}

TEST(XlaPjrt, AnOpTheEmitterDoesNotKnowFallsBackCountedAndWarnedOnce) {
  setenv("FULGUR_XLA_BACKEND", "pjrt", 1);
  TrainRun cpu = train("cpu", /*with_cos=*/true);
  TrainRun xla = train("xla", /*with_cos=*/true);
  expect_same(cpu, xla);
  const auto m = xla::metrics();
  ASSERT_TRUE(m.xla_fallbacks.count("aten::cos")) << xla::metrics_report();
  EXPECT_GE(m.xla_fallbacks.at("aten::cos"), 1);  // each graph with cos, when compiled
  EXPECT_GE(m.ts_fallback_executions, 20);        // the forward/backward graph of every step
  EXPECT_GT(m.xla_graphs_compiled, 0);              // the optimizer's graphs still go to XLA
  const std::regex cos_warning("a graph with aten::cos runs on the TorchScript backend");
  const auto n = std::distance(std::sregex_iterator(xla.stderr_text.begin(), xla.stderr_text.end(), cos_warning),
                               std::sregex_iterator());
  EXPECT_EQ(n, 1) << xla.stderr_text;
  EXPECT_THAT(xla::metrics_report(), HasSubstr("aten::cos="));
}

TEST(XlaPjrt, AnUnknownBackendNameIsAnErrorNamingTheValidOnes) {
  setenv("FULGUR_XLA_BACKEND", "tpu", 1);
  try {
    xla::backend();
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("'tpu'"));
    EXPECT_THAT(e.what(), HasSubstr("\"pjrt\""));
    EXPECT_THAT(e.what(), HasSubstr("\"ts\""));
    EXPECT_THAT(e.what(), HasSubstr("\"eager\""));
  }
}
