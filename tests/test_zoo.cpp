// SPDX-License-Identifier: Apache-2.0
// The model zoo: small models that combine what real ones do, trained 20 steps on xla with the
// Trainer. Each must stay on XLA (no graph kept on TorchScript, no op run on the host) and end
// where eager training ends. Dropout draws from the device generator on xla and from the CPU
// generator on eager, so the comparison runs with p = 0 (torch's dropout is then the identity
// and draws nothing); the same model with p > 0 is checked to stay on XLA and train.
//
// Tolerances: every loss and final parameter within 1e-4 relative + 1e-5 absolute of eager's
// (float32: sums in another order, XLA's transcendental functions, compounded over 20 steps).
//
// Each test runs in its own process (CTest), so the backend's counters start at zero.

#include "support.h"

#include <fulgur/lr_scheduler.h>
#include <fulgur/xla/backend.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

using namespace fulgur;
namespace nn = torch::nn;

namespace {

// A module that records the loss of each training step.
struct Recording : LightningModule {
  using LightningModule::LightningModule;
  at::Tensor record(const at::Tensor& loss) {
    losses.push_back(loss.detach());
    return loss;
  }
  at::Tensor recorded() const {
    std::vector<at::Tensor> out;
    for (const auto& l : losses) out.push_back(l.cpu().reshape({1}));
    return torch::cat(out);
  }
  std::vector<at::Tensor> losses;
};

// Linear-ReLU-Dropout-Linear-ReLU-Linear regression; AdamW with weight decay, a step-wise StepLR,
// and gradient_clip_val from the Trainer.
struct Mlp : Recording {
  explicit Mlp(double p) : Recording("Mlp") {
    fc1 = register_module("fc1", nn::Linear(8, 32));
    drop = register_module("drop", nn::Dropout(p));
    fc2 = register_module("fc2", nn::Linear(32, 16));
    fc3 = register_module("fc3", nn::Linear(16, 1));
  }
  StepOutput training_step(const Batch& b, int64_t) override {
    const auto h = torch::relu(fc2->forward(drop->forward(torch::relu(fc1->forward(b.data)))));
    return record(torch::mse_loss(fc3->forward(h), b.target));
  }
  OptimizerConfig configure_optimizers() override {
    auto opt = std::make_shared<torch::optim::AdamW>(parameters(), torch::optim::AdamWOptions(1e-2).weight_decay(0.01));
    return OptimizerConfig({opt}, {SchedulerConfig(std::make_shared<lr_scheduler::StepLR>(*opt, 5, 0.5)).interval("step")});
  }
  nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
  nn::Dropout drop{nullptr};
};

// A residual CNN: conv-BN-ReLU, then a residual block (conv-BN added to its input, ReLU),
// adaptive average pooling to 1x1, dropout, a linear classifier and cross-entropy; SGD with
// momentum and a step-wise StepLR.
struct ResidualCnn : Recording {
  explicit ResidualCnn(double p) : Recording("ResidualCnn") {
    conv1 = register_module("conv1", nn::Conv2d(nn::Conv2dOptions(1, 8, 3).padding(1)));
    bn1 = register_module("bn1", nn::BatchNorm2d(8));
    conv2 = register_module("conv2", nn::Conv2d(nn::Conv2dOptions(8, 8, 3).padding(1)));
    bn2 = register_module("bn2", nn::BatchNorm2d(8));
    pool = register_module("pool", nn::AdaptiveAvgPool2d(1));
    drop = register_module("drop", nn::Dropout(p));
    fc = register_module("fc", nn::Linear(8, 3));
  }
  StepOutput training_step(const Batch& b, int64_t) override {
    const auto h = torch::relu(bn1->forward(conv1->forward(b.data)));
    const auto r = torch::relu(h + bn2->forward(conv2->forward(h)));
    const auto logits = fc->forward(drop->forward(pool->forward(r).flatten(1)));
    return record(torch::cross_entropy_loss(logits, b.target));
  }
  OptimizerConfig configure_optimizers() override {
    auto opt = std::make_shared<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    return OptimizerConfig({opt}, {SchedulerConfig(std::make_shared<lr_scheduler::StepLR>(*opt, 10, 0.5)).interval("step")});
  }
  nn::Conv2d conv1{nullptr}, conv2{nullptr};
  nn::BatchNorm2d bn1{nullptr}, bn2{nullptr};
  nn::AdaptiveAvgPool2d pool{nullptr};
  nn::Dropout drop{nullptr};
  nn::Linear fc{nullptr};
};

// 160 8x8 images; the class says which of the left half, the right half or neither is brighter
// by more than 0.1.
std::shared_ptr<TensorDataset> image_data() {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  const at::Tensor x = at::randn({160, 1, 8, 8}, gen);
  const at::Tensor diff = x.slice(3, 0, 4).mean({1, 2, 3}) - x.slice(3, 4, 8).mean({1, 2, 3});
  const at::Tensor y = (diff > 0.1).to(torch::kLong) + 2 * (diff < -0.1).to(torch::kLong);
  return std::make_shared<TensorDataset>(x, y);
}

struct Run {
  at::Tensor losses;
  at::Tensor parameters;  // every parameter and buffer, flattened, on the CPU
};

Run train(Recording& model, const std::string& accelerator, std::shared_ptr<TensorDataset> data,
          std::optional<double> clip) {
  fulgur::testing::TempDir dir;
  Trainer t(TrainerOptions()
                .accelerator(accelerator)
                .devices(1)
                .max_steps(20)
                .seed(11)
                .gradient_clip_val(clip)
                .default_root_dir(dir.path)
                .enable_progress_bar(false)
                .enable_checkpointing(false)
                .logger(false)
                .num_sanity_val_steps(0));
  t.fit(model, std::make_shared<DataLoader>(data, DataLoaderOptions(8).shuffle(true)));
  std::vector<at::Tensor> flat;
  for (const auto& p : model.parameters()) flat.push_back(p.detach().cpu().reshape({-1}));
  for (const auto& b : model.buffers())
    if (b.is_floating_point()) flat.push_back(b.detach().cpu().reshape({-1}));
  return {model.recorded(), torch::cat(flat)};
}

// What left XLA since `before`: graphs kept on TorchScript by op, ops run on the host.
std::string left_xla(const xla::BackendMetrics& before) {
  const xla::BackendMetrics after = xla::metrics();
  std::string out;
  for (const auto& [op, n] : after.xla_fallbacks)
    if (!before.xla_fallbacks.count(op) || before.xla_fallbacks.at(op) != n) out += " on TorchScript: " + op;
  for (const auto& [op, n] : after.eager_fallbacks)
    if (!before.eager_fallbacks.count(op) || before.eager_fallbacks.at(op) != n) out += " host: " + op;
  return out;
}

// Trains `make(0)` on cpu and on xla (the same initial weights) and compares; then `make(p)` on
// xla with dropout on, which must stay on XLA too.
void check_model(const std::function<std::shared_ptr<Recording>(double)>& make, std::shared_ptr<TensorDataset> data,
                 std::optional<double> clip, double p) {
  torch::manual_seed(5);
  auto eager_model = make(0);
  torch::manual_seed(5);
  auto lazy_model = make(0);
  const Run eager = train(*eager_model, "cpu", data, clip);
  const xla::BackendMetrics before = xla::metrics();
  const Run lazy = train(*lazy_model, "xla", data, clip);
  EXPECT_EQ(left_xla(before), "") << xla::metrics_report();
  EXPECT_GT(xla::metrics().xla_executions, before.xla_executions);
  ASSERT_EQ(lazy.losses.numel(), 20);
  EXPECT_TRUE(torch::allclose(lazy.losses, eager.losses, 1e-4, 1e-5))
      << "losses: xla\n" << lazy.losses << "\neager\n" << eager.losses;
  EXPECT_TRUE(torch::allclose(lazy.parameters, eager.parameters, 1e-4, 1e-5))
      << "largest parameter difference " << (lazy.parameters - eager.parameters).abs().max().item<double>();

  torch::manual_seed(5);
  auto dropped = make(p);
  const xla::BackendMetrics before_dropout = xla::metrics();
  const Run with_dropout = train(*dropped, "xla", data, clip);
  EXPECT_EQ(left_xla(before_dropout), "") << xla::metrics_report();
  ASSERT_EQ(with_dropout.losses.numel(), 20);
  EXPECT_TRUE(with_dropout.losses.isfinite().all().item<bool>()) << with_dropout.losses;
  // The same initial weights and batches: only the dropped units make the losses differ.
  EXPECT_FALSE(torch::allclose(with_dropout.losses, lazy.losses)) << "dropout changed nothing";
}

}  // namespace

TEST(Zoo, MlpWithDropoutAdamWClippingAndAStepScheduler) {
  check_model([](double p) { return std::make_shared<Mlp>(p); }, fulgur::testing::regression_data(160), 0.5, 0.2);
}

TEST(Zoo, ResidualCnnWithBatchNormAdaptivePoolAndDropout) {
  check_model([](double p) { return std::make_shared<ResidualCnn>(p); }, image_data(), std::nullopt, 0.3);
}
