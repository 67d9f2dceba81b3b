// SPDX-License-Identifier: Apache-2.0
#pragma once
// The model zoo's models and data sets (tests/test_zoo.cpp trains them on xla against eager;
// bench/zoo_bench.cpp times them). Small models that combine what real ones do; each is a
// Recording, which keeps the loss of every training step, the compiled-graph count and the time
// when the step began.

#include <fulgur/fulgur.h>
#include <fulgur/lr_scheduler.h>
#include <fulgur/xla/backend.h>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <memory>
#include <vector>

namespace fulgur::zoo {

namespace nn = torch::nn;

// The steps after which XLA compiles no new graph: the first step, the second (the optimizer's
// state exists from then on) and one more.
constexpr size_t kWarmUp = 3;

// A module that records the loss of each training step.
struct Recording : LightningModule {
  using LightningModule::LightningModule;
  // Records the loss, how many graphs XLA had compiled when the step began (the step's own graph
  // compiles at its step mark, after this) and the time (the interval between two records is one
  // step's period, tracing, compiling and running included).
  at::Tensor record(const at::Tensor& loss) {
    losses.push_back(loss.detach());
    graphs.push_back(xla::metrics().xla_graphs_compiled);
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count());
    return loss;
  }
  at::Tensor recorded() const {
    std::vector<at::Tensor> out;
    for (const auto& l : losses) out.push_back(l.cpu().reshape({1}));
    return torch::cat(out);
  }
  std::vector<at::Tensor> losses;
  std::vector<int64_t> graphs;
  std::vector<double> times;  // seconds on the steady clock
};

// n samples of `in` standard normal features and the target x . w + 0.1 noise for a random w.
inline std::shared_ptr<TensorDataset> regression_data(int64_t n, int64_t in = 8, uint64_t seed = 0) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const at::Tensor x = at::randn({n, in}, gen);
  const at::Tensor w = at::randn({in, 1}, gen);
  const at::Tensor y = x.matmul(w) + 0.1 * at::randn({n, 1}, gen);
  return std::make_shared<TensorDataset>(x, y);
}

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

// A pre-norm Transformer encoder classifier: token and learned positional embeddings, one block
// of two-head self-attention written with matmuls (a causal mask from triu or'd with the padding
// tokens' mask, applied with masked_fill), LayerNorm, a GELU feed-forward, dropout on the
// attention weights and both residual branches, mean pooling and a linear head; AdamW with
// weight decay and a step-wise CosineAnnealingLR. Masked scores are -1e9, not -inf: a padded
// query row whose keys are all masked then averages instead of giving NaN. The q, k, v
// projection has no bias (see qkv).
struct TinyTransformer : Recording {
  static constexpr int64_t kVocab = 12, kLen = 8, kDim = 16, kHeads = 2;
  explicit TinyTransformer(double p) : Recording("TinyTransformer") {
    tok = register_module("tok", nn::Embedding(kVocab, kDim));
    pos = register_module("pos", nn::Embedding(kLen, kDim));
    ln1 = register_module("ln1", nn::LayerNorm(nn::LayerNormOptions({kDim})));
    // No bias: a key bias adds q . b to every score of a query's row, which softmax cancels, so
    // its gradient is zero up to rounding, and Adam would turn that rounding (which differs
    // between XLA and eager) into full-size steps.
    qkv = register_module("qkv", nn::Linear(nn::LinearOptions(kDim, 3 * kDim).bias(false)));
    proj = register_module("proj", nn::Linear(kDim, kDim));
    ln2 = register_module("ln2", nn::LayerNorm(nn::LayerNormOptions({kDim})));
    ff1 = register_module("ff1", nn::Linear(kDim, 2 * kDim));
    ff2 = register_module("ff2", nn::Linear(2 * kDim, kDim));
    drop = register_module("drop", nn::Dropout(p));
    head = register_module("head", nn::Linear(kDim, 2));
  }
  StepOutput training_step(const Batch& b, int64_t) override {
    const at::Tensor& ids = b.data;  // [B, T], token 0 is padding
    const int64_t B = ids.size(0), T = ids.size(1), dh = kDim / kHeads;
    // The positional table is the Embedding's weight, added whole (every sequence has kLen).
    at::Tensor x = tok->forward(ids) + pos->weight.unsqueeze(0);
    const auto parts = qkv->forward(ln1->forward(x)).chunk(3, -1);
    auto heads = [&](const at::Tensor& t) { return t.reshape({B, T, kHeads, dh}).transpose(1, 2); };
    const at::Tensor q = heads(parts[0]), k = heads(parts[1]), v = heads(parts[2]);
    at::Tensor scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(dh));
    const at::Tensor causal = torch::ones({T, T}, ids.options().dtype(torch::kBool)).triu(1);
    const at::Tensor padding = ids.eq(0).view({B, 1, 1, T});
    scores = scores.masked_fill(torch::logical_or(causal, padding), -1e9);
    const at::Tensor attention = drop->forward(torch::softmax(scores, -1));
    const at::Tensor context = torch::matmul(attention, v).transpose(1, 2).reshape({B, T, kDim});
    x = x + drop->forward(proj->forward(context));
    x = x + drop->forward(ff2->forward(torch::gelu(ff1->forward(ln2->forward(x)))));
    return record(torch::cross_entropy_loss(head->forward(x.mean(1)), b.target));
  }
  OptimizerConfig configure_optimizers() override {
    auto opt = std::make_shared<torch::optim::AdamW>(parameters(), torch::optim::AdamWOptions(5e-3).weight_decay(0.05));
    return OptimizerConfig({opt}, {SchedulerConfig(std::make_shared<lr_scheduler::CosineAnnealingLR>(*opt, 20, 1e-4)).interval("step")});
  }
  nn::Embedding tok{nullptr}, pos{nullptr};
  nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  nn::Linear qkv{nullptr}, proj{nullptr}, ff1{nullptr}, ff2{nullptr}, head{nullptr};
  nn::Dropout drop{nullptr};
};

// 160 sequences of kLen tokens in [1, kVocab), each padded with zeros after a random length of 3
// to kLen; the class says whether the sequence's first token is above the middle of the vocabulary.
inline std::shared_ptr<TensorDataset> token_data() {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
  const int64_t n = 160, T = TinyTransformer::kLen;
  const at::Tensor tokens = at::randint(1, TinyTransformer::kVocab, {n, T}, gen);
  const at::Tensor lengths = at::randint(3, T + 1, {n, 1}, gen);
  const at::Tensor ids = tokens * (at::arange(T).unsqueeze(0) < lengths).to(torch::kLong);
  const at::Tensor y = (tokens.select(1, 0) > TinyTransformer::kVocab / 2).to(torch::kLong);
  return std::make_shared<TensorDataset>(ids, y);
}

// A regression MLP with a robust loss: inputs clamped to [-2, 2], a leaky activation written with
// where, dropout, smooth_l1_loss; it logs metrics made of comparisons, argmax and topk (the batch's
// largest prediction is its largest target; the share of the top 3 predictions whose targets are
// positive; the share of predictions on the target's side of zero). SGD with momentum, weight
// decay and a step-wise MultiStepLR.
struct RobustRegression : Recording {
  explicit RobustRegression(double p) : Recording("RobustRegression") {
    fc1 = register_module("fc1", nn::Linear(8, 24));
    drop = register_module("drop", nn::Dropout(p));
    fc2 = register_module("fc2", nn::Linear(24, 1));
  }
  StepOutput training_step(const Batch& b, int64_t) override {
    const at::Tensor h = fc1->forward(b.data.clamp(-2, 2));
    const at::Tensor pred = fc2->forward(drop->forward(torch::where(h > 0, h, 0.1 * h)));
    const at::Tensor target = b.target;
    log("argmax_hit", pred.argmax(0).eq(target.argmax(0)).to(torch::kFloat).mean());
    const at::Tensor top = std::get<1>(pred.squeeze(1).topk(3));
    log("top3_positive", target.squeeze(1).index_select(0, top).gt(0).to(torch::kFloat).mean());
    log("sign_agreement", (pred > 0).eq(target > 0).to(torch::kFloat).mean());
    return record(torch::smooth_l1_loss(pred, target, at::Reduction::Mean, 0.5));
  }
  OptimizerConfig configure_optimizers() override {
    auto opt = std::make_shared<torch::optim::SGD>(
        parameters(), torch::optim::SGDOptions(0.05).momentum(0.9).weight_decay(1e-3));
    return OptimizerConfig({opt}, {SchedulerConfig(std::make_shared<lr_scheduler::MultiStepLR>(
                                                       *opt, std::vector<int64_t>{8, 15}, 0.3))
                                       .interval("step")});
  }
  nn::Linear fc1{nullptr}, fc2{nullptr};
  nn::Dropout drop{nullptr};
};

// A sequence regressor: an LSTM over 6 steps of 4 features (its sigmoid and tanh gates, the
// gate projections split into slices), the last step's output sliced off and cat with the mean
// over the steps, a hand-written gate (sigmoid of one projection times tanh of another), dropout,
// a linear output and mse_loss; AdamW with weight decay and a step-wise ExponentialLR.
struct SequenceRegressor : Recording {
  explicit SequenceRegressor(double p) : Recording("SequenceRegressor") {
    lstm = register_module("lstm", nn::LSTM(nn::LSTMOptions(4, 12).batch_first(true)));
    gate = register_module("gate", nn::Linear(24, 12));
    value = register_module("value", nn::Linear(24, 12));
    drop = register_module("drop", nn::Dropout(p));
    out = register_module("out", nn::Linear(12, 1));
  }
  StepOutput training_step(const Batch& b, int64_t) override {
    const at::Tensor seq = std::get<0>(lstm->forward(b.data));  // [B, T, 12]
    const int64_t T = seq.size(1);
    const at::Tensor last = seq.slice(1, T - 1, T).squeeze(1);
    const at::Tensor summary = torch::cat({last, seq.mean(1)}, 1);
    const at::Tensor h = torch::sigmoid(gate->forward(summary)) * torch::tanh(value->forward(summary));
    return record(torch::mse_loss(out->forward(drop->forward(h)), b.target));
  }
  OptimizerConfig configure_optimizers() override {
    auto opt = std::make_shared<torch::optim::AdamW>(parameters(), torch::optim::AdamWOptions(1e-2).weight_decay(0.01));
    return OptimizerConfig({opt}, {SchedulerConfig(std::make_shared<lr_scheduler::ExponentialLR>(*opt, 0.95)).interval("step")});
  }
  nn::LSTM lstm{nullptr};
  nn::Linear gate{nullptr}, value{nullptr}, out{nullptr};
  nn::Dropout drop{nullptr};
};

// 160 sequences of 6 steps of 4 features; the target is a decaying sum of the first feature
// over the steps (the latest weighs most).
inline std::shared_ptr<TensorDataset> sequence_data() {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(9);
  const at::Tensor x = at::randn({160, 6, 4}, gen);
  const at::Tensor weights = at::pow(0.7, at::arange(5, -1, -1, torch::kFloat));
  const at::Tensor y = (x.select(2, 0) * weights).sum(1, true);
  return std::make_shared<TensorDataset>(x, y);
}

// A variational autoencoder of 16 values in (0, 1): an encoder to the mean and log-variance of
// 4 latents, z = mu + sigma * eps with sigma = exp(logvar / 2) and eps = randn_like(sigma), a
// decoder with a sigmoid output, binary_cross_entropy summed over the values plus the KL term
// sum(sigma^2 + mu^2 - 1) / 2 - sum(log sigma), per sample. SGD with momentum, weight decay and a
// step-wise LinearLR warm-up. With p = 0 eps is zeros (the deterministic run eager is compared
// with); with p > 0 it is drawn.
struct Vae : Recording {
  explicit Vae(double p) : Recording("Vae"), sample(p > 0) {
    enc = register_module("enc", nn::Linear(16, 24));
    mu = register_module("mu", nn::Linear(24, 4));
    logvar = register_module("logvar", nn::Linear(24, 4));
    dec1 = register_module("dec1", nn::Linear(4, 24));
    dec2 = register_module("dec2", nn::Linear(24, 16));
  }
  StepOutput training_step(const Batch& b, int64_t) override {
    const at::Tensor h = torch::relu(enc->forward(b.data));
    const at::Tensor m = mu->forward(h), sigma = torch::exp(0.5 * logvar->forward(h));
    const at::Tensor eps = sample ? torch::randn_like(sigma) : torch::zeros_like(sigma);
    const at::Tensor recon = torch::sigmoid(dec2->forward(torch::relu(dec1->forward(m + sigma * eps))));
    const int64_t batch = b.data.size(0);
    const at::Tensor reconstruction = torch::binary_cross_entropy(recon, b.data, {}, at::Reduction::Sum);
    const at::Tensor kl = 0.5 * (sigma * sigma + m * m - 1).sum() - torch::log(sigma).sum();
    return record((reconstruction + kl) / batch);
  }
  OptimizerConfig configure_optimizers() override {
    auto opt = std::make_shared<torch::optim::SGD>(
        parameters(), torch::optim::SGDOptions(0.02).momentum(0.9).weight_decay(1e-3));
    return OptimizerConfig({opt}, {SchedulerConfig(std::make_shared<lr_scheduler::LinearLR>(*opt, 0.25, 1.0, 8))
                                       .interval("step")});
  }
  bool sample;
  nn::Linear enc{nullptr}, mu{nullptr}, logvar{nullptr}, dec1{nullptr}, dec2{nullptr};
};

// 160 vectors of 16 values in (0, 1) with structure to learn: sigmoids of 3 random factors.
inline std::shared_ptr<TensorDataset> vae_data() {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(13);
  const at::Tensor x = torch::sigmoid(at::randn({160, 3}, gen).matmul(at::randn({3, 16}, gen)));
  return std::make_shared<TensorDataset>(x, x);
}

// A small U-Net denoiser of 8x8 images: a conv block, max pooling to 4x4, a conv block with
// Dropout2d, nearest-neighbour upsampling back to 8x8 and a conv, the cat of that with the first
// block's output (the skip connection), a conv block and a 1x1 conv to one channel; mse_loss
// against the clean image. SGD with momentum, weight decay and a step-wise CosineAnnealingLR.
struct TinyUNet : Recording {
  explicit TinyUNet(double p) : Recording("TinyUNet") {
    enc1 = register_module("enc1", nn::Conv2d(nn::Conv2dOptions(1, 4, 3).padding(1)));
    enc2 = register_module("enc2", nn::Conv2d(nn::Conv2dOptions(4, 8, 3).padding(1)));
    drop = register_module("drop", nn::Dropout2d(p));
    up = register_module("up", nn::Upsample(nn::UpsampleOptions().scale_factor(std::vector<double>{2, 2}).mode(torch::kNearest)));
    up_conv = register_module("up_conv", nn::Conv2d(nn::Conv2dOptions(8, 4, 3).padding(1)));
    dec = register_module("dec", nn::Conv2d(nn::Conv2dOptions(8, 4, 3).padding(1)));
    out = register_module("out", nn::Conv2d(nn::Conv2dOptions(4, 1, 1)));
  }
  StepOutput training_step(const Batch& b, int64_t) override {
    const at::Tensor e1 = torch::relu(enc1->forward(b.data));                              // [B, 4, 8, 8]
    const at::Tensor e2 = drop->forward(torch::relu(enc2->forward(torch::max_pool2d(e1, 2))));  // [B, 8, 4, 4]
    const at::Tensor u = torch::relu(up_conv->forward(up->forward(e2)));                  // [B, 4, 8, 8]
    const at::Tensor d = torch::relu(dec->forward(torch::cat({u, e1}, 1)));
    return record(torch::mse_loss(out->forward(d), b.target));
  }
  OptimizerConfig configure_optimizers() override {
    auto opt = std::make_shared<torch::optim::SGD>(
        parameters(), torch::optim::SGDOptions(0.05).momentum(0.9).weight_decay(1e-4));
    return OptimizerConfig({opt}, {SchedulerConfig(std::make_shared<lr_scheduler::CosineAnnealingLR>(*opt, 20, 0.005))
                                       .interval("step")});
  }
  nn::Conv2d enc1{nullptr}, enc2{nullptr}, up_conv{nullptr}, dec{nullptr}, out{nullptr};
  nn::Dropout2d drop{nullptr};
  nn::Upsample up{nullptr};
};

// 160 noisy 8x8 images and their clean versions: smooth patterns (outer products of random
// vectors) plus Gaussian noise of standard deviation 0.3.
inline std::shared_ptr<TensorDataset> denoising_data() {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(17);
  const at::Tensor clean = (at::randn({160, 1, 8, 1}, gen) * at::randn({160, 1, 1, 8}, gen)).tanh();
  const at::Tensor noisy = clean + 0.3 * at::randn({160, 1, 8, 8}, gen);
  return std::make_shared<TensorDataset>(noisy, clean);
}

// 160 8x8 images; the class says which of the left half, the right half or neither is brighter
// by more than 0.1.
inline std::shared_ptr<TensorDataset> image_data() {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  const at::Tensor x = at::randn({160, 1, 8, 8}, gen);
  const at::Tensor diff = x.slice(3, 0, 4).mean({1, 2, 3}) - x.slice(3, 4, 8).mean({1, 2, 3});
  const at::Tensor y = (diff > 0.1).to(torch::kLong) + 2 * (diff < -0.1).to(torch::kLong);
  return std::make_shared<TensorDataset>(x, y);
}

}  // namespace fulgur::zoo
