// SPDX-License-Identifier: Apache-2.0
// The README's example as a whole program: a small classifier trained on
// random data for a few steps (two epochs of four batches) on one CPU device.
//   c++ -std=c++17 readme_example.cpp -Iinclude -lfulgur $(torch flags) -o readme_example

#include <fulgur/fulgur.h>

#include <torch/torch.h>

#include <cstdio>

// --- the README's example: from here ... ------------------------------------
struct Classifier : fulgur::LightningModule {
  Classifier() : fulgur::LightningModule("Classifier") {
    fc1 = register_module("fc1", torch::nn::Linear(20, 32));
    fc2 = register_module("fc2", torch::nn::Linear(32, 4));
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::relu(fc1(x))); }

  fulgur::StepOutput training_step(const fulgur::Batch& batch, int64_t) override {
    auto loss = torch::cross_entropy_loss(forward(batch.data), batch.target);
    log("train_loss", loss, fulgur::LogOptions().prog_bar(true));
    return loss;
  }
  fulgur::StepOutput validation_step(const fulgur::Batch& batch, int64_t) override {
    auto acc = forward(batch.data).argmax(1).eq(batch.target).to(torch::kFloat32).mean();
    log("val_acc", acc, fulgur::LogOptions().sync_dist(true));
    return {};
  }
  fulgur::OptimizerConfig configure_optimizers() override {
    return std::make_shared<torch::optim::Adam>(parameters(), torch::optim::AdamOptions(1e-2));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};

struct RandomData : fulgur::DataModule {
  void setup(const std::string&) override {
    data = std::make_shared<fulgur::TensorDataset>(torch::randn({512, 20}), torch::randint(0, 4, {512}));
  }
  std::shared_ptr<fulgur::BatchSource> train_dataloader() override {
    return std::make_shared<fulgur::DataLoader>(data, fulgur::DataLoaderOptions(32).shuffle(true));
  }
  std::shared_ptr<fulgur::BatchSource> val_dataloader() override {
    return std::make_shared<fulgur::DataLoader>(data, fulgur::DataLoaderOptions(128));
  }
  std::shared_ptr<fulgur::TensorDataset> data;
};
// --- ... to here ---------------------------------------------------------------

int main() {
  try {
    fulgur::seed_everything(0);  // first: the weights are drawn when `model` is made
    Classifier model;
    RandomData data;
    fulgur::Trainer trainer(fulgur::TrainerOptions()
                                .accelerator("cpu")
                                .devices("1")
                                .max_epochs(2)
                                .limit_train_batches(4)
                                .log_every_n_steps(2)
                                .default_root_dir("runs/readme_example")
                                .seed(0));
    trainer.fit(model, data);
    const auto& metrics = trainer.callback_metrics();
    const bool ok = trainer.global_step() == 8 && metrics.count("train_loss") == 1 && metrics.count("val_acc") == 1;
    std::printf("steps: %lld, val_acc: %.3f\n", static_cast<long long>(trainer.global_step()),
                metrics.count("val_acc") ? metrics.at("val_acc") : -1.0);
    return ok ? 0 : 1;
  } catch (const fulgur::WorkerFailure& e) {
    std::fprintf(stderr, "readme_example: %s\n", e.what());
    return e.exit_code();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "readme_example: error: %s\n", e.what());
    return 1;
  }
}
