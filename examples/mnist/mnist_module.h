// SPDX-License-Identifier: Apache-2.0
#pragma once
// The MNIST example's model and data, shared by the example, the tests and the benchmarks.

#include <fulgur/data/mnist.h>
#include <fulgur/fulgur.h>

#include <torch/torch.h>

namespace mnist {

// The steps, metrics and optimizer of every MNIST classifier; subclasses
// give the layers.
struct Classifier : fulgur::LightningModule {
  Classifier(std::string name, std::string model, double lr) : fulgur::LightningModule(std::move(name)), lr(lr) {
    auto hp = fulgur::make_dict();
    hp.insert("lr", lr);
    hp.insert("model", std::move(model));
    save_hyperparameters(hp);
  }

  virtual torch::Tensor forward(torch::Tensor x) = 0;

  fulgur::StepOutput training_step(const fulgur::Batch& batch, int64_t) override {
    auto loss = torch::cross_entropy_loss(forward(batch.data), batch.target);
    log("train_loss", loss, fulgur::LogOptions().prog_bar(true));
    return loss;
  }

  fulgur::StepOutput validation_step(const fulgur::Batch& batch, int64_t) override {
    auto logits = forward(batch.data);
    auto loss = torch::cross_entropy_loss(logits, batch.target);
    auto acc = logits.argmax(1).eq(batch.target).to(torch::kFloat32).mean();
    log("val_loss", loss, fulgur::LogOptions().prog_bar(true).sync_dist(true));
    log("val_acc", acc, fulgur::LogOptions().prog_bar(true).sync_dist(true));
    return loss;
  }

  fulgur::StepOutput test_step(const fulgur::Batch& batch, int64_t) override {
    auto logits = forward(batch.data);
    auto acc = logits.argmax(1).eq(batch.target).to(torch::kFloat32).mean();
    log("test_loss", torch::cross_entropy_loss(logits, batch.target), fulgur::LogOptions().sync_dist(true));
    log("test_acc", acc, fulgur::LogOptions().sync_dist(true));
    return {};
  }

  torch::Tensor predict_step(const fulgur::Batch& batch, int64_t) override { return forward(batch.data).argmax(1); }

  fulgur::OptimizerConfig configure_optimizers() override {
    return std::make_shared<torch::optim::Adam>(parameters(), torch::optim::AdamOptions(lr));
  }

  double lr;
};

// A small CNN: two 5x5 convolutions with pooling, then two linear layers.
struct CNN : Classifier {
  explicit CNN(double lr = 1e-3) : Classifier("MnistCNN", "cnn", lr) {
    conv1 = register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 16, 5).padding(2)));
    conv2 = register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 32, 5).padding(2)));
    fc1 = register_module("fc1", torch::nn::Linear(32 * 7 * 7, 128));
    fc2 = register_module("fc2", torch::nn::Linear(128, 10));
  }

  torch::Tensor forward(torch::Tensor x) override {
    x = torch::max_pool2d(torch::relu(conv1->forward(x)), 2);
    x = torch::max_pool2d(torch::relu(conv2->forward(x)), 2);
    x = torch::relu(fc1->forward(x.flatten(1)));
    return fc2->forward(x);
  }

  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};

// A multi-layer perceptron: 784 -> 256 -> 128 -> 10 with ReLU.
struct MLP : Classifier {
  explicit MLP(double lr = 1e-3) : Classifier("MnistMLP", "mlp", lr) {
    fc1 = register_module("fc1", torch::nn::Linear(28 * 28, 256));
    fc2 = register_module("fc2", torch::nn::Linear(256, 128));
    fc3 = register_module("fc3", torch::nn::Linear(128, 10));
  }

  torch::Tensor forward(torch::Tensor x) override {
    x = torch::relu(fc1->forward(x.flatten(1)));
    x = torch::relu(fc2->forward(x));
    return fc3->forward(x);
  }

  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
};

// "cnn" or "mlp"; anything else is std::invalid_argument naming the choices.
inline std::shared_ptr<Classifier> make_model(const std::string& name, double lr) {
  if (name == "cnn") return std::make_shared<CNN>(lr);
  if (name == "mlp") return std::make_shared<MLP>(lr);
  throw std::invalid_argument("model '" + name + "' is unknown; choose cnn or mlp");
}

// MNIST train split as 55,000 training and 5,000 validation images; the
// 10,000 test images for test.
struct DataModule : fulgur::DataModule {
  DataModule(std::string dir, int64_t batch_size, uint64_t seed = 0, int64_t train_limit = 0)
      : dir(std::move(dir)), batch_size(batch_size), seed(seed), train_limit(train_limit) {}

  void setup(const std::string& stage) override {
    if (stage == "fit" || stage == "validate") {
      auto full = fulgur::load_mnist(dir, fulgur::Split::kTrain);
      const int64_t n_train = train_limit > 0 ? std::min<int64_t>(train_limit, 55000) : 55000;
      train = std::make_shared<fulgur::SubsetDataset>(full, 0, n_train);
      val = std::make_shared<fulgur::SubsetDataset>(full, 55000, 5000);
    } else {
      test = fulgur::load_mnist(dir, fulgur::Split::kTest);
    }
  }
  std::shared_ptr<fulgur::BatchSource> train_dataloader() override {
    return std::make_shared<fulgur::DataLoader>(
        train, fulgur::DataLoaderOptions(batch_size).shuffle(true).seed(seed).drop_last(true));
  }
  std::shared_ptr<fulgur::BatchSource> val_dataloader() override {
    return std::make_shared<fulgur::DataLoader>(val, fulgur::DataLoaderOptions(256));
  }
  std::shared_ptr<fulgur::BatchSource> test_dataloader() override {
    return std::make_shared<fulgur::DataLoader>(test, fulgur::DataLoaderOptions(256));
  }

  std::string dir;
  int64_t batch_size;
  uint64_t seed;
  int64_t train_limit;
  std::shared_ptr<fulgur::Dataset> train, val, test;
};

}  // namespace mnist
