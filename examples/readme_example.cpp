// SPDX-License-Identifier: Apache-2.0
// The README's first example, which the README shows from the first #include to the
// end (a test compares the two): a small classifier trained on random data for two epochs of
// four batches, on the devices "auto" picks (xla devices here, one worker per core; a GPU
// where there is one). CTest runs it (ReadmeExample.Runs).
#include <fulgur/fulgur.h>
#include <torch/torch.h>

#include <cstdio>

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

int main() {
  fulgur::seed_everything(0);  // first: the weights are drawn when `model` is made
  Classifier model;
  RandomData data;
  fulgur::Trainer trainer(fulgur::TrainerOptions().max_epochs(2).limit_train_batches(4).seed(0)
                              .default_root_dir("runs/readme_example"));
  trainer.fit(model, data);  // the workers train; `model` then holds rank 0's weights
  std::printf("steps: %lld, val_acc: %.3f\n", static_cast<long long>(trainer.global_step()),
              trainer.callback_metrics().at("val_acc"));
  return trainer.global_step() == 8 ? 0 : 1;
}
