// SPDX-License-Identifier: Apache-2.0
// Precision plugins: bf16-mixed is CPU autocast to bfloat16 with float32
// weights; 16-mixed (CUDA only) is refused elsewhere with the reason, and its
// GradScaler's logic is checked here on CPU tensors.
#include "support.h"

#include <ATen/autocast_mode.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

using namespace fulgur;
using fulgur::testing::regression_data;
using fulgur::testing::TempDir;
using ::testing::HasSubstr;

namespace {

// Linear, conv1d and matmul (all lowered to bfloat16 by CPU autocast), then an
// MSE loss; records the dtype each produced in the last training and validation step.
struct Probe : LightningModule {
  Probe() : LightningModule("Probe") {
    fc = register_module("fc", torch::nn::Linear(8, 16));
    conv = register_module("conv", torch::nn::Conv1d(torch::nn::Conv1dOptions(1, 1, 3).padding(1)));
    head = register_parameter("head", torch::randn({16, 1}) * 0.25);
  }
  at::Tensor forward(const at::Tensor& x, std::map<std::string, c10::ScalarType>& seen) {
    auto h = fc->forward(x);
    seen["linear"] = h.scalar_type();
    auto c = conv->forward(h.unsqueeze(1)).squeeze(1);
    seen["conv1d"] = c.scalar_type();
    auto m = torch::matmul(torch::relu(c), head);
    seen["matmul"] = m.scalar_type();
    return m;
  }
  StepOutput training_step(const Batch& b, int64_t) override {
    auto loss = torch::mse_loss(forward(b.data, train_seen), b.target);
    train_seen["mse_loss"] = loss.scalar_type();
    autocast_on_in_step = at::autocast::is_cpu_enabled();
    return loss;
  }
  StepOutput validation_step(const Batch& b, int64_t) override {
    auto loss = torch::mse_loss(forward(b.data, val_seen), b.target);
    val_losses.push_back(loss.item<double>());
    log("val_loss", loss);
    return loss;
  }
  OptimizerConfig configure_optimizers() override {
    return std::make_shared<torch::optim::Adam>(parameters(), torch::optim::AdamOptions(0.01));
  }
  void on_before_optimizer_step(torch::optim::Optimizer&) override {
    grad_types.clear();
    for (const auto& p : parameters()) grad_types.push_back(p.grad().defined() ? p.grad().scalar_type() : c10::kByte);
  }
  torch::nn::Linear fc{nullptr};
  torch::nn::Conv1d conv{nullptr};
  at::Tensor head;
  std::map<std::string, c10::ScalarType> train_seen, val_seen;
  std::vector<double> val_losses;
  std::vector<c10::ScalarType> grad_types;  // in the last step; kByte: none
  bool autocast_on_in_step = false;
};

void fit(Probe& model, const std::string& precision, const std::string& root) {
  auto data = regression_data(256);
  Trainer trainer(TrainerOptions().accelerator("cpu").devices(1).precision(precision).default_root_dir(root)
                      .max_epochs(15).enable_progress_bar(false).enable_checkpointing(false).logger(false)
                      .enable_model_summary(false));
  trainer.fit(model, std::make_shared<DataLoader>(data, DataLoaderOptions(32).shuffle(true)),
              std::make_shared<DataLoader>(data, DataLoaderOptions(256)));
}

}  // namespace

TEST(Precision, Bf16MixedRunsAutocastOpsInBfloat16WithFloat32WeightsAndConverges) {
  TempDir dir;
  torch::manual_seed(0);
  Probe model;
  fit(model, "bf16-mixed", dir.path);
  EXPECT_TRUE(model.autocast_on_in_step);
  EXPECT_FALSE(at::autocast::is_cpu_enabled());  // restored after the step
  for (const auto* seen : {&model.train_seen, &model.val_seen}) {
    EXPECT_EQ(seen->at("linear"), c10::kBFloat16);
    EXPECT_EQ(seen->at("conv1d"), c10::kBFloat16);
    EXPECT_EQ(seen->at("matmul"), c10::kBFloat16);
  }
  // mse_loss is on autocast's float32 list.
  EXPECT_EQ(model.train_seen.at("mse_loss"), c10::kFloat);
  for (const auto& p : model.parameters()) EXPECT_EQ(p.scalar_type(), c10::kFloat);
  ASSERT_EQ(model.grad_types.size(), model.parameters().size());
  for (auto t : model.grad_types) EXPECT_EQ(t, c10::kFloat);  // kByte: no gradient
  // The targets have variance ~8 and noise 0.01: the loss falls by far more than 20 times.
  ASSERT_GE(model.val_losses.size(), 2u);
  EXPECT_GT(model.val_losses.front(), 1.0);
  EXPECT_LT(model.val_losses.back(), 0.2);
  EXPECT_LT(model.val_losses.back(), model.val_losses.front() / 20);
}

TEST(Precision, ThirtyTwoTrueRunsTheSameOpsInFloat32) {
  TempDir dir;
  torch::manual_seed(0);
  Probe model;
  fit(model, "32-true", dir.path);
  EXPECT_FALSE(model.autocast_on_in_step);
  EXPECT_EQ(model.train_seen.at("linear"), c10::kFloat);
  EXPECT_EQ(model.train_seen.at("conv1d"), c10::kFloat);
  EXPECT_EQ(model.train_seen.at("matmul"), c10::kFloat);
}

TEST(Precision, NamesAndRefusals) {
  EXPECT_EQ(Precision("bf16").name(), "bf16-mixed");  // Lightning's short names
  EXPECT_EQ(Precision("16").name(), "16-mixed");
  try {
    Trainer t(TrainerOptions().accelerator("cpu").precision("16-mixed"));
    FAIL() << "16-mixed accepted on cpu";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("precision '16-mixed' is float16 autocast, which runs on CUDA devices"));
    EXPECT_THAT(e.what(), HasSubstr("accelerator is 'cpu'"));
    EXPECT_THAT(e.what(), HasSubstr("\"bf16-mixed\""));
  }
  try {
    Trainer t(TrainerOptions().precision("16-true"));
    FAIL() << "16-true accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("valid: \"32-true\", \"bf16-mixed\", \"bf16-true\", \"16-mixed\""));
  }
  // bf16-mixed autocasts lazy tensors on xla (tests/test_zoo_precision.cpp trains with it).
  EXPECT_NO_THROW(Trainer(TrainerOptions().accelerator("xla").devices(1).precision("bf16-mixed")));
}

// A strategy object made by hand with 16-mixed on the CPU is refused when it sets up, naming the device.
TEST(Precision, SixteenMixedOnACpuStrategyObjectIsRefusedAtSetup) {
  TempDir dir;
  auto strategy = std::make_shared<SingleDeviceStrategy>(c10::Device(c10::kCPU), std::make_shared<CPUAccelerator>(), nullptr,
                                                         std::make_shared<Precision>("16-mixed"));
  Trainer trainer(TrainerOptions().strategy(strategy).default_root_dir(dir.path).max_epochs(1).logger(false)
                      .enable_progress_bar(false).enable_checkpointing(false).enable_model_summary(false));
  fulgur::testing::TinyRegression model;
  try {
    trainer.fit(model, std::make_shared<DataLoader>(regression_data(32), DataLoaderOptions(8)));
    FAIL() << "16-mixed ran on the CPU";
  } catch (const std::exception& e) {
    EXPECT_THAT(e.what(), HasSubstr("precision '16-mixed'"));
    EXPECT_THAT(e.what(), HasSubstr("the device is cpu"));
  }
}

namespace {

// One float parameter per dtype group, with a gradient set by hand.
struct ScalerRig {
  at::Tensor w = torch::ones({3}).requires_grad_();
  at::Tensor b = torch::zeros({2}, torch::kDouble).requires_grad_();
  torch::optim::SGD sgd{std::vector<at::Tensor>{w, b}, torch::optim::SGDOptions(1.0)};
  void grads(const at::Tensor& gw, const at::Tensor& gb) {
    w.mutable_grad() = gw.clone();
    b.mutable_grad() = gb.clone();
  }
};

}  // namespace

TEST(GradScaler, ScalesTheLossUnscalesTheGradientsAndStepsWhenFinite) {
  GradScaler scaler(1024.0, 2.0, 0.5, 3);
  const at::Tensor loss = torch::tensor(0.25);
  EXPECT_DOUBLE_EQ(scaler.scale(loss).item<double>(), 0.25 * 1024.0);
  ScalerRig rig;
  rig.grads(torch::full({3}, 1024.0 * 0.5), torch::full({2}, 1024.0 * 2.0, torch::kDouble));
  scaler.unscale(rig.sgd);
  EXPECT_FALSE(scaler.found_inf());
  EXPECT_TRUE(torch::equal(rig.w.grad(), torch::full({3}, 0.5)));  // 2^-n scales are exact
  EXPECT_TRUE(torch::equal(rig.b.grad(), torch::full({2}, 2.0, torch::kDouble)));
  EXPECT_THROW(scaler.unscale(rig.sgd), std::logic_error);  // twice in one step
  EXPECT_TRUE(scaler.step(rig.sgd, [&] { rig.sgd.step(); }));
  EXPECT_TRUE(torch::equal(rig.w.detach(), torch::full({3}, 0.5)));
  scaler.update();
  EXPECT_EQ(scaler.growth_tracker(), 1);
  EXPECT_DOUBLE_EQ(scaler.get_scale(), 1024.0);
}

TEST(GradScaler, AnOverflowSkipsTheStepAndBacksOffAndFiniteStepsGrowTheScale) {
  for (const double bad : {std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity(),
                           std::numeric_limits<double>::quiet_NaN()}) {
    GradScaler scaler(1024.0, 2.0, 0.5, 2);
    ScalerRig rig;
    // A finite step first, so that the tracker has something to reset.
    rig.grads(torch::ones({3}), torch::ones({2}, torch::kDouble));
    scaler.unscale(rig.sgd);
    scaler.step(rig.sgd, [&] { rig.sgd.step(); });
    scaler.update();
    ASSERT_EQ(scaler.growth_tracker(), 1);
    const at::Tensor before = rig.w.detach().clone();
    // One non-finite value in one group of one parameter is enough.
    rig.grads(torch::ones({3}), torch::tensor({1.0, bad}, torch::kDouble));
    scaler.unscale(rig.sgd);
    EXPECT_TRUE(scaler.found_inf()) << bad;
    bool ran = false;
    EXPECT_FALSE(scaler.step(rig.sgd, [&] {
      ran = true;
      rig.sgd.step();
    })) << bad;
    EXPECT_FALSE(ran) << bad;
    EXPECT_TRUE(torch::equal(rig.w.detach(), before)) << "a skipped step changed the parameters, grad " << bad;
    scaler.update();
    EXPECT_DOUBLE_EQ(scaler.get_scale(), 512.0) << bad;
    EXPECT_EQ(scaler.growth_tracker(), 0) << bad;
    // growth_interval (2) finite steps in a row double the scale.
    for (int i = 0; i < 2; ++i) {
      rig.grads(torch::ones({3}), torch::ones({2}, torch::kDouble));
      scaler.unscale(rig.sgd);
      EXPECT_TRUE(scaler.step(rig.sgd, [&] { rig.sgd.step(); }));
      scaler.update();
    }
    EXPECT_DOUBLE_EQ(scaler.get_scale(), 1024.0) << bad;
    EXPECT_EQ(scaler.growth_tracker(), 0) << bad;
  }
}

TEST(GradScaler, StateRoundTripsAndBadStatesAndSettingsAreRefused) {
  GradScaler scaler(256.0, 4.0, 0.25, 5);
  ScalerRig rig;
  rig.grads(torch::ones({3}), torch::ones({2}, torch::kDouble));
  scaler.unscale(rig.sgd);
  scaler.step(rig.sgd, [&] { rig.sgd.step(); });
  scaler.update();
  const auto state = scaler.state_dict();
  EXPECT_DOUBLE_EQ(state.at("scale").toDouble(), 256.0);
  EXPECT_EQ(state.at("_growth_tracker").toInt(), 1);
  EXPECT_EQ(state.at("growth_interval").toInt(), 5);
  GradScaler restored;
  restored.load_state_dict(state, "test");
  EXPECT_DOUBLE_EQ(restored.get_scale(), 256.0);
  EXPECT_EQ(restored.growth_tracker(), 1);
  EXPECT_DOUBLE_EQ(restored.state_dict().at("growth_factor").toDouble(), 4.0);
  for (const auto& [key, value] : std::vector<std::pair<std::string, c10::IValue>>{
           {"scale", -1.0}, {"scale", std::numeric_limits<double>::infinity()}, {"_growth_tracker", int64_t(-3)},
           {"growth_factor", 0.5}, {"backoff_factor", 1.5}, {"growth_interval", int64_t(0)}, {"scale", std::string("x")}}) {
    auto bad = scaler.state_dict();
    bad.insert_or_assign(key, value);
    GradScaler target;
    EXPECT_THROW(target.load_state_dict(bad, "ckpt"), std::runtime_error) << key;
    EXPECT_DOUBLE_EQ(target.get_scale(), 65536.0) << "a refused state changed the scaler: " << key;
  }
  auto missing = scaler.state_dict();
  missing.erase("scale");
  EXPECT_THROW(GradScaler().load_state_dict(missing, "ckpt"), std::runtime_error);
  EXPECT_THROW(GradScaler(0.0), std::invalid_argument);
  EXPECT_THROW(GradScaler(8.0, 1.0), std::invalid_argument);
  EXPECT_THROW(GradScaler(8.0, 2.0, 1.0), std::invalid_argument);
  EXPECT_THROW(GradScaler(8.0, 2.0, 0.5, 0), std::invalid_argument);
}
