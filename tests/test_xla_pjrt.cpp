// SPDX-License-Identifier: Apache-2.0
// xla devices on the torch::lazy backend with PJRT (FULGUR_XLA_BACKEND=pjrt, the default): graphs
// emitted as StableHLO, compiled and run by the real XLA CPU plugin, give the CPU's losses and
// parameters for the MLP, the MNIST CNN and MLP and the character model; XLA compiles stop after
// warm-up and a batch-size change recompiles and warns; device data stays in PJRT buffers between
// steps; two workers equal one with twice the batch, and their gradient sync copies each gradient
// once each way; workers forked after the parent used PJRT fail naming spawn, spawned ones train;
// a lazy-to-lazy copy reaches the PJRT buffer; a graph with an op the emitter does not know runs
// on TorchScript, counted and warned about once by name. Each test runs in its own process
// (CTest), so the backend starts fresh from the environment each test sets.

#include "support.h"

#include "xla/pjrt_backend.h"

#include <charlm/charlm_module.h>
#include <mnist/mnist_module.h>

#include <fulgur/xla/backend.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <regex>
#include <ATen/FunctionalTensorWrapper.h>
#include <torch/csrc/lazy/core/metrics.h>
#include <torch/optim/adam.h>

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

// The Mlp trained on cpu and on xla with the pjrt backend, checked to agree (expect_same).
std::pair<TrainRun, TrainRun> trained_on_cpu_and_pjrt() {
  setenv("FULGUR_XLA_BACKEND", "pjrt", 1);
  TrainRun cpu = train("cpu");
  TrainRun xla = train("xla");
  expect_same(cpu, xla);
  return {std::move(cpu), std::move(xla)};
}

}  // namespace

TEST(XlaPjrt, MlpTrainsWithTheEagerLossesAndParameters) {
  const auto [cpu, xla] = trained_on_cpu_and_pjrt();
  EXPECT_EQ(xla::backend().name(), "pjrt");
  const auto m = xla::metrics();
  EXPECT_TRUE(m.xla_fallbacks.empty()) << xla::metrics_report();
  EXPECT_GT(m.xla_graphs_compiled, 0);
  // One execution per step: forward, backward and update are one graph, and
  // zero_grad leaves the gradients to the next backward (when it filled them
  // with zeros, that was a graph of its own). Besides the 20 steps: the first
  // step's setup graph and, at the end, a small graph for each of the 4
  // parameters moved back to the CPU.
  EXPECT_GE(m.xla_executions, 20);
  EXPECT_LE(m.xla_executions, 25);
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

// A FULGUR_XLA_HOST_KERNELS value other than "0" or "1" is the user's error, thrown from the first
// compile and naming the value and the valid ones, not a silent default. In a child process
// (threadsafe: the parent's backend stays untouched); the exit code says which exception came.
TEST(XlaPjrt, AnInvalidHostKernelsSettingIsAnErrorNamingTheValidOnes) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        setenv("FULGUR_XLA_BACKEND", "pjrt", 1);
        setenv("FULGUR_XLA_HOST_KERNELS", "yes", 1);
        try {
          train("xla");
        } catch (const std::invalid_argument& e) {
          std::fprintf(stderr, "invalid_argument: %s\n", e.what());
          std::_Exit(3);
        } catch (const std::exception& e) {
          std::fprintf(stderr, "other exception: %s\n", e.what());
          std::_Exit(4);
        }
        std::_Exit(0);
      },
      ::testing::ExitedWithCode(3),
      "invalid_argument: FULGUR_XLA_HOST_KERNELS='yes' is not valid: \"0\" .*\"1\" .*or unset");
}

namespace {

// `Base` (an example's module) with each step's loss and the XLA graph count after it recorded.
template <class Base>
struct Recorded : Base {
  using Base::Base;
  void on_train_batch_end(const StepOutput& out, const Batch&, int64_t) override {
    losses.push_back(out.loss().item<double>());
    xla_graphs_after_step.push_back(xla::metrics().xla_graphs_compiled);
  }
  std::vector<double> losses;
  std::vector<int64_t> xla_graphs_after_step;
};

template <class M>
struct ModelRun {
  std::shared_ptr<M> net;
  std::string stderr_text;
};

// One epoch over `data` in batches of `batch` on `accelerator`, from the weights `make` gives
// after torch::manual_seed(7).
template <class M>
ModelRun<M> fit(const std::string& accelerator, const std::function<std::shared_ptr<M>()>& make,
                std::shared_ptr<Dataset> data, int64_t batch) {
  TempDir dir;
  torch::manual_seed(7);
  ModelRun<M> r{make(), ""};
  Trainer t(TrainerOptions()
                .accelerator(accelerator)
                .devices(1)
                .max_epochs(1)
                .default_root_dir(dir.path)
                .enable_progress_bar(false)
                .enable_checkpointing(false)
                .enable_model_summary(false)
                .num_sanity_val_steps(0));
  ::testing::internal::CaptureStderr();
  try {
    t.fit(*r.net, std::make_shared<DataLoader>(std::move(data), DataLoaderOptions(batch)));
  } catch (...) {
    r.stderr_text = ::testing::internal::GetCapturedStderr();
    throw;
  }
  r.stderr_text = ::testing::internal::GetCapturedStderr();
  return r;
}

// Losses of every step and parameters after them within `tol` of the CPU's; no graph kept on
// TorchScript; XLA compiled nothing after step 4.
template <class M>
void expect_like_the_cpu(const ModelRun<M>& cpu, const ModelRun<M>& xla, size_t steps, double tol) {
  ASSERT_EQ(cpu.net->losses.size(), steps);
  ASSERT_EQ(xla.net->losses.size(), steps);
  for (size_t i = 0; i < steps; ++i) EXPECT_NEAR(xla.net->losses[i], cpu.net->losses[i], tol) << "step " << i;
  EXPECT_LT(cpu.net->losses.back(), cpu.net->losses.front());
  auto a = cpu.net->named_parameters(), b = xla.net->named_parameters();
  for (const auto& p : a) {
    ASSERT_TRUE(b[p.key()].device().is_cpu()) << p.key();
    EXPECT_LE((b[p.key()] - p.value()).abs().max().template item<double>(), tol) << p.key();
  }
  const auto m = xla::metrics();
  EXPECT_EQ(xla::backend().name(), "pjrt");
  EXPECT_TRUE(m.xla_fallbacks.empty()) << xla::metrics_report();
  EXPECT_EQ(m.ts_fallback_executions, 0);
  const auto& g = xla.net->xla_graphs_after_step;
  EXPECT_GT(g[4], 0);
  EXPECT_EQ(g.back(), g[4]) << "XLA was still compiling graphs after warm-up";
}

// n random 28x28 images with random labels.
std::shared_ptr<Dataset> random_images(int64_t n) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
  return std::make_shared<TensorDataset>(at::rand({n, 1, 28, 28}, gen), at::randint(0, 10, {n}, gen));
}

// n random 28x28 images whose label l brightens rows 2l..2l+4: a task SGD learns within a few
// steps (random labels it does not, in 20).
std::shared_ptr<Dataset> banded_images(int64_t n) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
  at::Tensor labels = at::randint(0, 10, {n}, gen), images = at::rand({n, 1, 28, 28}, gen) * 0.5;
  for (int64_t i = 0; i < n; ++i) images[i].narrow(1, 2 * labels[i].item<int64_t>(), 5).add_(0.5);
  return std::make_shared<TensorDataset>(images, labels);
}

}  // namespace

// The example's CNN with SGD instead of its Adam. Adam divides each gradient by its running
// size, so a weight whose gradient is a rounding error on one side and exactly 0 on the other (a
// ReLU just on or off) moves by up to lr per step on one side only: after 20 steps of the Adam
// CNN, fc1.weight differed by 1.2e-4 on an AMD EPYC (AVX2) machine with every op within its
// per-op tolerance, and by 5.6e-6 with libtorch's own convolutions (FULGUR_XLA_HOST_KERNELS=1).
// With SGD a parameter's difference is the sum of its gradients' differences, which is what this
// test is meant to bound. Adam on PJRT is checked by the MLP and charlm tests below.
struct SgdCnn : Recorded<mnist::CNN> {
  using Recorded<mnist::CNN>::Recorded;
  OptimizerConfig configure_optimizers() override {
    return std::make_shared<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  }
};

TEST(XlaPjrt, MnistCnnTrainsWithTheEagerLossesAndParameters) {
  using Cnn = SgdCnn;
  auto make = [] { return std::make_shared<Cnn>(); };
  auto cpu = fit<Cnn>("cpu", make, banded_images(160), 8);
  auto xla = fit<Cnn>("xla", make, banded_images(160), 8);
  expect_like_the_cpu(cpu, xla, 20, 1e-4);
}

namespace {

// In a child process (which makes its own PJRT client): PJRT_NPROC=nproc, FULGUR_XLA_HOST_KERNELS
// = host (nullptr: unset), 5 steps of the SGD CNN on cpu and on xla. Exits with 2 when a loss or
// parameter is off by more than 1e-4, else with 10 + whether convolutions ran libtorch's kernels.
[[noreturn]] void exit_with_the_convolution_choice(const char* nproc, const char* host) {
  setenv("FULGUR_XLA_BACKEND", "pjrt", 1);
  setenv("PJRT_NPROC", nproc, 1);
  if (host) setenv("FULGUR_XLA_HOST_KERNELS", host, 1); else unsetenv("FULGUR_XLA_HOST_KERNELS");
  auto make = [] { return std::make_shared<SgdCnn>(); };
  auto cpu = fit<SgdCnn>("cpu", make, banded_images(40), 8);
  auto xla = fit<SgdCnn>("xla", make, banded_images(40), 8);
  double worst = 0;
  for (size_t i = 0; i < cpu.net->losses.size(); ++i)
    worst = std::max(worst, std::abs(cpu.net->losses[i] - xla.net->losses[i]));
  auto a = cpu.net->named_parameters(), b = xla.net->named_parameters();
  for (const auto& p : a) worst = std::max(worst, (b[p.key()] - p.value()).abs().max().item<double>());
  std::fprintf(stderr, "steps %zu, largest difference %g\n%s\n", xla.net->losses.size(), worst,
               xla::metrics_report().c_str());
  if (xla.net->losses.size() != 5 || !(worst <= 1e-4)) std::_Exit(2);
  std::_Exit(10 + (xla::metrics().xla_host_convolutions ? 1 : 0));
}

}  // namespace

// FULGUR_XLA_HOST_KERNELS unset: the CPU plugin runs libtorch's convolutions, on one XLA:CPU
// thread (PJRT_NPROC=1, two workers on two cores) and on two; "0" keeps XLA's own on either.
// Either way the CNN trains like eager, and the metrics report says which ran.
TEST(XlaPjrt, ConvolutionsRunLibtorchsKernelsOnTheCpuPluginUnlessTurnedOff) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(exit_with_the_convolution_choice("1", nullptr), ::testing::ExitedWithCode(11),
              "convolutions: +libtorch's kernels");
  EXPECT_EXIT(exit_with_the_convolution_choice("2", nullptr), ::testing::ExitedWithCode(11),
              "convolutions: +libtorch's kernels");
  EXPECT_EXIT(exit_with_the_convolution_choice("1", "0"), ::testing::ExitedWithCode(10), "convolutions: +XLA's own");
  EXPECT_EXIT(exit_with_the_convolution_choice("2", "0"), ::testing::ExitedWithCode(10), "convolutions: +XLA's own");
}

TEST(XlaPjrt, MnistMlpTrainsWithTheEagerLossesAndParameters) {
  using Mlp = Recorded<mnist::MLP>;
  auto make = [] { return std::make_shared<Mlp>(1e-3); };
  // Learnable images: on random labels whether the 20th loss is below the first is luck (it was
  // not on an H200 machine's CPU).
  auto cpu = fit<Mlp>("cpu", make, banded_images(160), 8);
  auto xla = fit<Mlp>("xla", make, banded_images(160), 8);
  expect_like_the_cpu(cpu, xla, 20, 1e-4);
}

TEST(XlaPjrt, CharlmTrainsWithTheEagerLossesAndParameters) {
  using Lm = Recorded<charlm::CharLM>;
  charlm::Config cfg;
  cfg.vocab_size = 13;
  cfg.block_size = 16;
  cfg.n_embd = 32;
  cfg.n_head = 2;
  cfg.n_layer = 1;
  auto make = [cfg] { return std::make_shared<Lm>(cfg); };
  // Windows of a cycle through the 13 tokens from random starts: each next token is learnable.
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  auto tokens = (at::randint(0, 13, {80, 1}, gen) + at::arange(17).view({1, 17})).remainder(13);
  auto data = std::make_shared<TensorDataset>(tokens.narrow(1, 0, 16).contiguous(), tokens.narrow(1, 1, 16).contiguous());
  auto cpu = fit<Lm>("cpu", make, data, 4);
  auto xla = fit<Lm>("xla", make, data, 4);
  expect_like_the_cpu(cpu, xla, 20, 1e-4);
}

TEST(XlaPjrt, ABatchSizeChangeRecompilesAndWarns) {
  using Mlp = Recorded<mnist::MLP>;
  auto make = [] { return std::make_shared<Mlp>(1e-3); };
  auto r = fit<Mlp>("xla", make, random_images(8 * 8 + 3), 8);  // 8 full batches, then one of 3
  const auto& g = r.net->xla_graphs_after_step;
  ASSERT_EQ(g.size(), 9u);
  EXPECT_EQ(g[7], g[4]);
  EXPECT_GT(g[8], g[7]) << "XLA compiled no graph for the batch of 3";
  EXPECT_THAT(r.stderr_text, HasSubstr("xla graph recompiled at step 8"));
  EXPECT_THAT(r.stderr_text, HasSubstr("from [8, 1, 28, 28], [8] to [3, 1, 28, 28], [3]"));
}

namespace {

// The Mlp, holding before each optimizer step (but the first) the lazy tensor under fc1.weight's
// exp_avg: device data that a tensor other than the updated one still holds, so the step must
// not take its buffer over. After the step it must still read as the value before it.
struct HoldsAnOldAdamState : Mlp {
  HoldsAnOldAdamState() : Mlp(false) {}
  void on_before_optimizer_step(torch::optim::Optimizer& opt) override {
    const auto it = opt.state().find(fc1->weight.unsafeGetTensorImpl());
    if (it == opt.state().end()) return;
    const torch::Tensor& exp_avg = static_cast<torch::optim::AdamParamState&>(*it->second).exp_avg();
    at::functionalization::impl::sync(exp_avg);
    held = at::functionalization::impl::from_functional_tensor(exp_avg);
    held_before = held.to(torch::kCPU);
  }
  void on_train_batch_end(const StepOutput& out, const Batch& b, int64_t i) override {
    Mlp::on_train_batch_end(out, b, i);
    if (held.defined() && !torch::equal(held.to(torch::kCPU), held_before)) ++clobbered;
    held = torch::Tensor();
  }
  torch::Tensor held, held_before;
  int clobbered = 0;
};

}  // namespace

// Adam's state (exp_avg, exp_avg_sq: read only by its update) is updated in place: each step's
// execution takes over the buffers of the old values, 2 per parameter from the second step on
// (the first reads the zeros it makes). The weights are not (the forward and backward read them
// too). Device data another tensor still holds is copied instead, and keeps its value.
TEST(XlaPjrt, AdamsStateIsUpdatedInPlaceUnlessAnotherTensorHoldsIt) {
  setenv("FULGUR_XLA_BACKEND", "pjrt", 1);
  const auto before = xla::metrics();  // the counts are the process's (another test may have run)
  const auto [cpu, xla] = trained_on_cpu_and_pjrt();
  const int64_t params = 4, bytes = 161 * 4;  // fc1 and fc2, 161 floats
  auto m = xla::metrics();
  EXPECT_EQ(m.xla_buffers_donated - before.xla_buffers_donated, 2 * params * 19) << xla::metrics_report();
  EXPECT_EQ(m.xla_bytes_donated - before.xla_bytes_donated, 2 * bytes * 19);
  EXPECT_THAT(xla::metrics_report(), HasSubstr("buffers donated:     " + std::to_string(m.xla_buffers_donated)));

  TempDir dir;
  torch::manual_seed(7);
  HoldsAnOldAdamState net;
  Trainer t(TrainerOptions().accelerator("xla").devices(1).max_epochs(1).default_root_dir(dir.path)
                .enable_progress_bar(false).enable_checkpointing(false).enable_model_summary(false));
  t.fit(net, std::make_shared<DataLoader>(regression_data(160), DataLoaderOptions(8)));
  ASSERT_EQ(net.losses.size(), 20u);
  EXPECT_EQ(net.clobbered, 0);
  for (size_t i = 0; i < net.losses.size(); ++i) EXPECT_NEAR(net.losses[i], cpu.net->losses[i], 1e-4) << "step " << i;
  const auto after = xla::metrics();
  EXPECT_EQ(after.xla_buffers_donated - m.xla_buffers_donated, (2 * params - 1) * 19) << xla::metrics_report();
}

TEST(XlaPjrt, DeviceDataStaysOnTheDeviceBetweenSteps) {
  // 64 steps of the Linear+ReLU MLP (161 parameters, 644 bytes as float). Each step uploads its
  // batch (8 x 9 floats, 288 bytes) and a few numbers, and downloads its loss (4 bytes, item());
  // parameters and Adam's state stay in PJRT buffers (uploaded once, downloaded once at the end
  // of fit). Round-tripping them would move about 3 x 644 bytes each way per step.
  setenv("FULGUR_XLA_BACKEND", "pjrt", 1);
  TempDir dir;
  torch::manual_seed(7);
  Mlp net(false);
  Trainer t(TrainerOptions().accelerator("xla").devices(1).max_epochs(2).default_root_dir(dir.path)
                .enable_progress_bar(false).enable_checkpointing(false).enable_model_summary(false));
  t.fit(net, std::make_shared<DataLoader>(regression_data(256), DataLoaderOptions(8)));
  ASSERT_EQ(net.losses.size(), 64u);
  const auto m = xla::metrics();
  EXPECT_GT(m.xla_executions, 64);
  const double up_per_step = static_cast<double>(m.bytes_to_device) / 64;
  const double down_per_step = static_cast<double>(m.bytes_to_host) / 64;
  EXPECT_LT(up_per_step, 288 + 644) << xla::metrics_report();
  EXPECT_LT(down_per_step, 644) << xla::metrics_report();
}

namespace {

// On every worker at the end of fit: the graphs ran on XLA, none on TorchScript, and this rank's
// parameters equal rank 0's bit for bit.
struct CheckedOnPjrt : fulgur::testing::TinyRegression {
  void on_fit_end() override {
    auto fail = [](const std::string& what) { throw std::runtime_error("in worker: " + what); };
    const auto m = xla::metrics();
    if (xla::backend().name() != "pjrt") fail("backend " + xla::backend().name());
    if (m.xla_executions == 0 || !m.xla_fallbacks.empty()) fail("not on XLA: " + xla::metrics_report());
    std::vector<torch::Tensor> flat;
    for (auto& p : parameters()) flat.push_back(p.detach().to(torch::kCPU).reshape({-1}));
    auto all = trainer()->strategy().all_gather(torch::cat(flat));
    for (int64_t r = 1; r < all.size(0); ++r)
      if (!torch::equal(all[0], all[r])) fail("rank " + std::to_string(r) + "'s parameters differ from rank 0's");
  }
};

torch::Tensor flat_parameters(torch::nn::Module& m) {
  std::vector<torch::Tensor> flat;
  for (auto& p : m.parameters()) flat.push_back(p.detach().reshape({-1}));
  return torch::cat(flat);
}

}  // namespace

TEST(XlaPjrt, TwoWorkersEqualOneWorkerWithTwiceTheBatch) {
  setenv("FULGUR_XLA_BACKEND", "pjrt", 1);
  TempDir dir;
  auto options = [&](const std::string& strategy, int devices) {
    return TrainerOptions().accelerator("xla").strategy(strategy).devices(devices).max_epochs(2)
        .default_root_dir(dir.path).enable_progress_bar(false).enable_checkpointing(false)
        .enable_model_summary(false).num_sanity_val_steps(0).collective_timeout_ms(20000);
  };
  auto loader = [](int64_t batch) {
    return std::make_shared<DataLoader>(regression_data(64), DataLoaderOptions(batch).shuffle(true).seed(4));
  };
  torch::manual_seed(0);
  CheckedOnPjrt two;
  torch::manual_seed(0);
  fulgur::testing::TinyRegression one;
  Trainer t2(options("xla", 2));
  t2.fit(two, loader(4));
  Trainer t1(options("single_xla", 1));
  t1.fit(one, loader(8));
  EXPECT_EQ(t2.global_step(), 16);
  EXPECT_TRUE(torch::allclose(flat_parameters(two), flat_parameters(one), 1e-5, 1e-6))
      << flat_parameters(two) << "\n" << flat_parameters(one);
  EXPECT_GT(xla::metrics().xla_executions, 0);  // the one-worker run, in this process
}

TEST(XlaPjrt, ACheckpointSavedFromPjrtDevicesResumesOntoThem) {
  // 8 steps, a checkpoint (parameters and Adam's state downloaded from PJRT buffers), then a new
  // Trainer resumes onto the device from it: the losses are those of an uninterrupted run on
  // xla (within 1e-6: the resumed state went through the host exactly, the graphs are the same).
  setenv("FULGUR_XLA_BACKEND", "pjrt", 1);
  TempDir dir;
  auto options = [&](const std::string& sub) {
    return TrainerOptions().accelerator("xla").devices(1).max_epochs(3).seed(9).default_root_dir(dir.path + sub)
        .enable_progress_bar(false).enable_checkpointing(false).enable_model_summary(false).num_sanity_val_steps(0);
  };
  auto loader = [] {
    return std::make_shared<DataLoader>(regression_data(48), DataLoaderOptions(8).shuffle(true).seed(3));
  };
  auto make = [] {
    torch::manual_seed(1);
    return std::make_shared<Mlp>(false);
  };
  auto full = make();
  Trainer tf(options("/a"));
  tf.fit(*full, loader());
  ASSERT_EQ(full->losses.size(), 18u);
  auto first = make();
  Trainer t1(options("/b").max_steps(8));
  t1.fit(*first, loader());
  t1.save_checkpoint(dir.path + "/mid.ckpt");
  auto second = make();
  Trainer t2(options("/b"));
  t2.fit(*second, loader(), nullptr, dir.path + "/mid.ckpt");
  std::vector<double> joined = first->losses;
  joined.insert(joined.end(), second->losses.begin(), second->losses.end());
  ASSERT_EQ(joined.size(), full->losses.size());
  for (size_t i = 0; i < joined.size(); ++i) EXPECT_NEAR(joined[i], full->losses[i], 1e-6) << "step " << i;
  EXPECT_TRUE(xla::metrics().xla_fallbacks.empty()) << xla::metrics_report();
}

namespace {

// On each of 2 workers, between two batch ends (one gradient sync) after warm-up: each of the
// two gradients (fc.weight [1, 8], fc.bias [1]: 9 floats, 36 bytes) went once out of its PJRT
// buffer straight into the sync's bucket and once from the bucket into a new buffer, and the
// bytes downloaded are those 36, less than a second copy (72). (The squared error is written out:
// torch::mse_loss runs eagerly on lazy tensors, downloading its operands.)
struct OneCopySync : fulgur::testing::TinyRegression {
  StepOutput training_step(const Batch& b, int64_t) override {
    auto d = forward(b.data) - b.target;
    return (d * d).mean();
  }
  void on_train_batch_end(const StepOutput&, const Batch&, int64_t) override {
    seen.push_back(xla::pjrt_backend_metrics());
  }
  void on_fit_end() override {
    auto fail = [](const std::string& what) { throw std::runtime_error("in worker: " + what); };
    if (seen.size() != 16) fail(std::to_string(seen.size()) + " batch ends, not 16");
    for (size_t i = 5; i < seen.size(); ++i) {
      const auto& a = seen[i - 1];
      const auto& b = seen[i];
      const std::string at = " between batch ends " + std::to_string(i - 1) + " and " + std::to_string(i);
      if (b.one_copy_to_host - a.one_copy_to_host != 2)
        fail(std::to_string(b.one_copy_to_host - a.one_copy_to_host) + " one-copy downloads" + at);
      if (b.one_copy_to_device - a.one_copy_to_device != 2)
        fail(std::to_string(b.one_copy_to_device - a.one_copy_to_device) + " one-copy uploads" + at);
      const int64_t down = b.bytes_to_host - a.bytes_to_host;
      if (down < 36 || down >= 72) fail(std::to_string(down) + " bytes downloaded" + at);
    }
  }
  std::vector<xla::PjrtBackendMetrics> seen;
};

}  // namespace

TEST(XlaPjrt, TwoWorkersSyncEachGradientWithOneCopyEachWay) {
  setenv("FULGUR_XLA_BACKEND", "pjrt", 1);
  TempDir dir;
  torch::manual_seed(0);
  OneCopySync net;
  Trainer t(TrainerOptions().accelerator("xla").strategy("xla").devices(2).max_epochs(1).default_root_dir(dir.path)
                .enable_progress_bar(false).enable_checkpointing(false).enable_model_summary(false)
                .num_sanity_val_steps(0).collective_timeout_ms(20000));
  t.fit(net, std::make_shared<DataLoader>(regression_data(128), DataLoaderOptions(4)));
  EXPECT_EQ(t.global_step(), 16);
}

namespace {

// A one-device fit on xla in this process (its PJRT client starts here), then a fit on 2 workers
// started by `start_method`.
void one_device_then_two_workers(const std::string& start_method) {
  setenv("FULGUR_XLA_BACKEND", "pjrt", 1);
  TempDir dir;
  auto options = [&](const std::string& strategy, int devices) {
    return TrainerOptions().accelerator("xla").strategy(strategy).devices(devices).max_epochs(1)
        .default_root_dir(dir.path).enable_progress_bar(false).enable_checkpointing(false)
        .enable_model_summary(false).num_sanity_val_steps(0).collective_timeout_ms(20000);
  };
  torch::manual_seed(0);
  fulgur::testing::TinyRegression one;
  Trainer t1(options("single_xla", 1));
  t1.fit(one, std::make_shared<DataLoader>(regression_data(32), DataLoaderOptions(8)));
  ASSERT_GT(xla::metrics().xla_executions, 0);
  torch::manual_seed(0);
  CheckedOnPjrt two;
  Trainer t2(options("xla", 2).start_method(start_method));
  t2.fit(two, std::make_shared<DataLoader>(regression_data(32), DataLoaderOptions(4)));
  EXPECT_EQ(t2.global_step(), 4);
}

}  // namespace

TEST(XlaPjrt, ForkedWorkersAfterTheParentUsedPjrtFailNamingSpawn) {
  try {
    one_device_then_two_workers("fork");
    FAIL() << "no error";
  } catch (const std::exception& e) {
    EXPECT_THAT(e.what(), HasSubstr("forked from pid"));
    EXPECT_THAT(e.what(), HasSubstr("start_method(\"spawn\")"));
  }
}

TEST(XlaPjrt, SpawnedWorkersAfterTheParentUsedPjrtTrain) { one_device_then_two_workers("spawn"); }

TEST(XlaPjrt, ANumberThatRepeatsIsUploadedOnce) {
  // A graph's numbers are arguments (an optimizer's learning rate, betas, eps; here 0.5). The one
  // that is the same every step is uploaded at its first step only; the one that changes
  // (1.5 + i, as a bias correction does) is uploaded every step, 8 bytes (a float number is f64).
  setenv("FULGUR_XLA_BACKEND", "pjrt", 1);
  const c10::Device dev = xla::backend().device();
  const at::Tensor host = at::arange(6, at::kFloat);
  const at::Tensor x = host.to(dev);
  xla::mark_step();
  std::vector<int64_t> up;
  for (int i = 0; i < 6; ++i) {
    const at::Tensor y = x * 0.5 + (1.5 + i);
    xla::mark_step();
    up.push_back(xla::metrics().bytes_to_device);
    EXPECT_TRUE(torch::allclose(y.cpu(), host * 0.5 + (1.5 + i))) << y.cpu();
  }
  for (size_t i = 2; i < up.size(); ++i) EXPECT_EQ(up[i] - up[i - 1], 8) << "step " << i << "\n" << xla::metrics_report();
}

TEST(XlaPjrt, ALazyToLazyCopyReachesTheDeviceBuffer) {
  // dst comes from a CPU tensor and has been read by a graph, so it holds both its host tensor
  // and a PJRT buffer and no pending graph; dst.copy_(src) with src on xla (libtorch's
  // _copy_from, lazy to lazy). A graph that reads dst afterwards must see src's values.
  setenv("FULGUR_XLA_BACKEND", "pjrt", 1);
  const c10::Device dev = xla::backend().device();
  const at::Tensor host = at::arange(6, at::kFloat).view({2, 3});
  at::Tensor dst = host.to(dev);
  EXPECT_TRUE(torch::equal((dst * 2).cpu(), host * 2));  // a graph took dst's buffer
  xla::mark_step();
  const at::Tensor src_values = at::full({2, 3}, 7.0f);
  at::Tensor src = src_values.to(dev);
  dst.copy_(src);
  EXPECT_TRUE(torch::equal(dst.cpu(), src_values)) << dst.cpu();
  EXPECT_TRUE(torch::equal((dst * 2).cpu(), src_values * 2)) << (dst * 2).cpu();
  // The same with src the result of a graph (device data only, no host tensor).
  at::Tensor src2 = (src + 1);
  xla::mark_step();
  dst.copy_(src2);
  EXPECT_TRUE(torch::equal((dst * 2).cpu(), (src_values + 1) * 2)) << (dst * 2).cpu();
}

TEST(XlaPjrt, ALazyToLazyCopyIntoAGraphResultTheHostReadReachesTheDeviceBuffer) {
  // dst is a graph's result (a PJRT buffer), then copied into a CPU tensor (libtorch's
  // _copy_from keeps the downloaded value as dst's host tensor beside its buffer), then
  // dst.copy_(src) with src on xla. A graph that reads dst afterwards must see src's values.
  setenv("FULGUR_XLA_BACKEND", "pjrt", 1);
  const c10::Device dev = xla::backend().device();
  const at::Tensor host = at::arange(6, at::kFloat).view({2, 3});
  at::Tensor dst = host.to(dev) + 1;
  xla::mark_step();
  EXPECT_TRUE(torch::equal(dst.cpu(), host + 1));
  const at::Tensor src_values = at::full({2, 3}, 7.0f);
  at::Tensor src = src_values.to(dev) * 1;
  xla::mark_step();
  dst.copy_(src);
  EXPECT_TRUE(torch::equal((dst * 2).cpu(), src_values * 2)) << (dst * 2).cpu();
  EXPECT_TRUE(torch::equal(dst.cpu(), src_values)) << dst.cpu();
}

namespace {

// The lazy tensor under functionalization's wrapper: copies between such tensors run libtorch's
// own _copy_from (LazyNativeFunctions::_copy_from) instead of being traced as a graph's copy.
at::Tensor unwrapped(const at::Tensor& t) { return at::functionalization::impl::from_functional_tensor(t); }

int64_t copy_from_count() {
  const auto* c = torch::lazy::GetCounter("lazy::_copy_from");
  return c ? c->Value() : 0;
}

}  // namespace

TEST(XlaPjrt, LibtorchsLazyToLazyCopyFromReachesTheDeviceBuffer) {
  // _copy_from's lazy-to-lazy branch writes dst's host tensor when dst has no pending graph.
  // (a) dst fresh from the host (a host tensor, no buffer yet); (b) dst a graph's result whose
  // value the host read with a copy into a CPU tensor (_copy_from keeps the downloaded value as
  // dst's host tensor beside its PJRT buffer). A graph reading dst afterwards must see src.
  setenv("FULGUR_XLA_BACKEND", "pjrt", 1);
  const c10::Device dev = xla::backend().device();
  const at::Tensor host = at::arange(6, at::kFloat).view({2, 3});
  const at::Tensor src_values = at::full({2, 3}, 7.0f);
  at::Tensor src = unwrapped(src_values.to(dev));

  at::Tensor fresh = unwrapped(host.to(dev));
  const int64_t copies = copy_from_count();
  fresh.copy_(src);
  EXPECT_EQ(copy_from_count(), copies + 1);
  EXPECT_TRUE(torch::equal((fresh * 2).cpu(), src_values * 2)) << (fresh * 2).cpu();

  at::Tensor result = unwrapped(host.to(dev) + 1);
  xla::mark_step();
  at::Tensor seen = at::empty({2, 3});
  seen.copy_(result);
  ASSERT_TRUE(torch::equal(seen, host + 1));
  result.copy_(src);
  EXPECT_EQ(copy_from_count(), copies + 3);
  EXPECT_TRUE(torch::equal(result.cpu(), src_values)) << result.cpu();
  EXPECT_TRUE(torch::equal((result * 2).cpu(), src_values * 2)) << (result * 2).cpu();

  // Into another dtype, and broadcast from a row.
  at::Tensor wide = unwrapped(at::zeros({2, 3}, at::kDouble).to(dev));
  wide.copy_(src);
  EXPECT_TRUE(torch::equal((wide * 2).cpu(), src_values.to(at::kDouble) * 2)) << (wide * 2).cpu();
  result.copy_(unwrapped(at::arange(3, at::kFloat).to(dev)));
  EXPECT_TRUE(torch::equal((result * 2).cpu(), at::arange(3, at::kFloat).expand({2, 3}) * 2)) << (result * 2).cpu();
}
