// Precision plugins (issue 14): bf16-mixed is CPU autocast to bfloat16 with
// float32 weights; 16-bit float precisions are refused with the reason.
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
  EXPECT_EQ(Precision("bf16").name(), "bf16-mixed");  // Lightning's short name
  try {
    Trainer t(TrainerOptions().accelerator("cpu").precision("16-mixed"));
    FAIL() << "16-mixed accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("precision '16-mixed' is not supported"));
    EXPECT_THAT(e.what(), HasSubstr("valid: \"32-true\", \"bf16-mixed\", \"bf16-true\""));
    EXPECT_THAT(e.what(), HasSubstr("needs a GPU"));
  }
  try {
    Trainer t(TrainerOptions().accelerator("xla").devices(1).precision("bf16-mixed"));
    FAIL() << "bf16-mixed accepted on xla";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("precision 'bf16-mixed' is CPU autocast"));
    EXPECT_THAT(e.what(), HasSubstr("\"bf16-true\""));
  }
}
