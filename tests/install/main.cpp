// SPDX-License-Identifier: Apache-2.0
// The outside program of the Install.* test: a one-layer model fitted for a
// few batches on one xla device (the XLA CPU plugin), through fulgur's installed headers.
#include <fulgur/data/data_loader.h>
#include <fulgur/lightning_module.h>
#include <fulgur/trainer.h>

#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <cstdio>

struct Tiny : fulgur::LightningModule {
  Tiny() : fulgur::LightningModule("Tiny") { fc = register_module("fc", torch::nn::Linear(4, 2)); }
  fulgur::StepOutput training_step(const fulgur::Batch& batch, int64_t) override {
    on_xla = batch.data.device().type() == c10::DeviceType::Lazy;
    auto loss = torch::cross_entropy_loss(fc(batch.data), batch.target);
    log("train_loss", loss);
    return loss;
  }
  fulgur::OptimizerConfig configure_optimizers() override {
    return std::make_shared<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.1));
  }
  torch::nn::Linear fc{nullptr};
  bool on_xla = false;  // the last batch was on an xla (lazy) device
};

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: app <default_root_dir>\n");
    return 2;
  }
  fulgur::seed_everything(0);
  Tiny model;
  auto data = std::make_shared<fulgur::TensorDataset>(torch::randn({64, 4}), torch::randint(0, 2, {64}));
  fulgur::Trainer trainer(fulgur::TrainerOptions()
                              .accelerator("xla")
                              .devices(1)
                              .max_epochs(1)
                              .enable_progress_bar(false)
                              .default_root_dir(argv[1]));
  trainer.fit(model, std::make_shared<fulgur::DataLoader>(data, fulgur::DataLoaderOptions(16)));
  std::printf("fulgur consumer: %lld steps on %s\n", static_cast<long long>(trainer.global_step()),
              model.on_xla ? "xla" : "another device");
  return 0;
}
