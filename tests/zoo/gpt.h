// SPDX-License-Identifier: Apache-2.0
#pragma once
// The zoo's GPT-style decoder and its generation (tests/test_zoo_gpt.cpp, bench/zoo_bench.cpp).

#include "zoo/models.h"

#include <fulgur/xla/backend.h>

#include <torch/torch.h>

#include <stdexcept>
#include <string>
#include <vector>

namespace fulgur::zoo {

// A window of the last kBlock tokens of each sequence being generated, left-padded: tokens
// ([B, kBlock] int64, 0 where padded), positions (the position embedding's row of each token:
// 0, 1, ... from the first real token; 0 where padded) and padded ([B, kBlock] bool, true where
// padded). Every generation step shifts it left by one token, so its shapes never change.
struct Window {
  at::Tensor tokens, positions, padded;
};

// charlm's decoder (examples/charlm: token and learned position embeddings, a pre-norm block of
// causal self-attention from separate query, key and value maps and a GELU MLP, a final
// LayerNorm), with GPT's weight tying (the output projection is the token embedding's weight,
// one parameter) and dropout on the attention weights and both residual branches. Next-token
// cross-entropy; AdamW with weight decay and a step-wise OneCycleLR (its momentum cycle moves
// AdamW's beta1 each step). As in TinyTransformer (models.h), the key map has no bias, and masked
// scores are -1e9 rather than -inf, so that a padded query row, whose keys are all masked,
// averages instead of giving NaN.
struct TinyGpt : Recording {
  static constexpr int64_t kVocab = 10, kBlock = 8, kDim = 16, kHeads = 2;
  explicit TinyGpt(double p) : Recording("TinyGpt") {
    tok = register_module("tok", nn::Embedding(kVocab, kDim));
    pos = register_module("pos", nn::Embedding(kBlock, kDim));
    ln1 = register_module("ln1", nn::LayerNorm(nn::LayerNormOptions({kDim})));
    query = register_module("query", nn::Linear(kDim, kDim));
    key = register_module("key", nn::Linear(nn::LinearOptions(kDim, kDim).bias(false)));
    value = register_module("value", nn::Linear(kDim, kDim));
    proj = register_module("proj", nn::Linear(kDim, kDim));
    ln2 = register_module("ln2", nn::LayerNorm(nn::LayerNormOptions({kDim})));
    fc1 = register_module("fc1", nn::Linear(kDim, 4 * kDim));
    fc2 = register_module("fc2", nn::Linear(4 * kDim, kDim));
    ln_f = register_module("ln_f", nn::LayerNorm(nn::LayerNormOptions({kDim})));
    drop = register_module("drop", nn::Dropout(p));
  }

  // Logits [B, T, kVocab] of real tokens ids [B, T], T <= kBlock, at positions 0 ... T - 1. Full
  // windows (training) add the position table as it is, with no slice in the traced graph.
  at::Tensor forward(const at::Tensor& ids) {
    const int64_t t = ids.size(1);
    return decode(tok->forward(ids) + (t == kBlock ? pos->weight : pos->weight.slice(0, 0, t)), {});
  }
  // Logits of a generation window: positions from the window, padded keys masked.
  at::Tensor forward(const Window& w) {
    return decode(tok->forward(w.tokens) + pos->forward(w.positions), w.padded);
  }

  StepOutput training_step(const Batch& b, int64_t) override {
    const at::Tensor logits = forward(b.data);
    return record(torch::cross_entropy_loss(logits.reshape({-1, kVocab}), b.target.reshape({-1})));
  }
  OptimizerConfig configure_optimizers() override {
    auto opt = std::make_shared<torch::optim::AdamW>(parameters(), torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
    return OptimizerConfig({opt}, {SchedulerConfig(std::make_shared<lr_scheduler::OneCycleLR>(*opt, 2e-2, 20)).interval("step")});
  }

  // The window of `prompt` ([B, P] token ids, P >= 1, on any device): its last kBlock tokens,
  // left-padded, on `device`. Made on the host: one upload.
  static Window window_of(const at::Tensor& prompt, const c10::Device& device) {
    if (prompt.dim() != 2 || prompt.size(1) < 1 || prompt.scalar_type() != torch::kLong) {
      throw std::invalid_argument("TinyGpt: the prompt must be [B, P] int64 token ids with P >= 1, got " +
                                  std::string(prompt.toString()) + " of sizes " + c10::str(prompt.sizes()));
    }
    const at::Tensor ids = prompt.cpu();
    const int64_t b = ids.size(0), n = std::min(ids.size(1), kBlock), pad = kBlock - n;
    Window w{torch::zeros({b, kBlock}, torch::kLong), torch::zeros({b, kBlock}, torch::kLong),
             torch::ones({b, kBlock}, torch::kBool)};
    using torch::indexing::Slice;
    w.tokens.index_put_({Slice(), Slice(pad, kBlock)}, ids.index({Slice(), Slice(ids.size(1) - n, ids.size(1))}));
    w.positions.index_put_({Slice(), Slice(pad, kBlock)}, torch::arange(n));
    w.padded.index_put_({Slice(), Slice(pad, kBlock)}, false);
    return {w.tokens.to(device), w.positions.to(device), w.padded.to(device)};
  }

  // `n` tokens after `prompt` ([B, P] on the model's device) -> [B, n]. temperature 0 takes the
  // most likely token (greedy); above 0 it samples from softmax(logits / temperature) with the
  // Gumbel-max trick, argmax(logits / temperature - log(-log(u))) for u uniform in [0, 1), u drawn
  // on the model's device (on xla: the device generator, seeded by seed_everything or
  // xla::manual_seed). Each step runs the model on the window of the last kBlock tokens, whose
  // shapes do not change, and on an xla device ends with a step mark, so that every step runs the
  // same graph and the tokens stay on the device; the last one, [B, n], is one more graph.
  at::Tensor generate(const at::Tensor& prompt, int64_t n, double temperature = 0) {
    if (n < 1 || temperature < 0) {
      throw std::invalid_argument("TinyGpt::generate: n must be >= 1 and temperature >= 0, got n=" + std::to_string(n) +
                                  ", temperature=" + std::to_string(temperature));
    }
    torch::NoGradGuard no_grad;
    const bool was_training = is_training();
    eval();
    const c10::Device device = tok->weight.device();
    Window w = window_of(prompt, device);
    std::vector<at::Tensor> out;
    for (int64_t i = 0; i < n; ++i) {
      {  // the logits are gone by the step mark: not an output of the step's graph
        at::Tensor logits = forward(w).select(1, kBlock - 1);  // [B, kVocab]: the newest token's
        if (temperature > 0) logits = logits / temperature - torch::log(-torch::log(torch::rand_like(logits)));
        out.push_back(logits.argmax(-1, true));  // [B, 1]
      }
      w = shift(w, out.back());
      if (device.type() == c10::kLazy) xla::mark_step();
    }
    train(was_training);
    return torch::cat(out, 1);
  }

  // `w` with its first token dropped and `next` ([B, 1]) appended at position (the last
  // position + 1); once the window is full, every position moves down by one, so that the
  // positions stay 0 ... kBlock - 1, as charlm's generate crops to the last kBlock tokens.
  static Window shift(const Window& w, const at::Tensor& next) {
    using torch::indexing::Slice;
    const at::Tensor last = w.positions.index({Slice(), Slice(kBlock - 1, kBlock)}) + 1;
    at::Tensor positions = torch::cat({w.positions.index({Slice(), Slice(1, kBlock)}), last}, 1);
    positions = (positions - (last >= kBlock).to(torch::kLong)).clamp_min(0);
    // The newest token is real (padded's last column is false), and so is the one appended.
    const at::Tensor padded = torch::cat(
        {w.padded.index({Slice(), Slice(1, kBlock)}), w.padded.index({Slice(), Slice(kBlock - 1, kBlock)})}, 1);
    return {torch::cat({w.tokens.index({Slice(), Slice(1, kBlock)}), next}, 1), positions, padded};
  }

 private:
  // x: [B, kBlock, kDim] embedded tokens; padded: [B, kBlock] bool keys to mask, or undefined.
  at::Tensor decode(at::Tensor x, const at::Tensor& padded) {
    const int64_t b = x.size(0), t = x.size(1), dh = kDim / kHeads;
    auto heads = [&](const at::Tensor& y) { return y.reshape({b, t, kHeads, dh}).transpose(1, 2); };
    const at::Tensor h = ln1->forward(x);
    const at::Tensor q = heads(query->forward(h)), k = heads(key->forward(h)), v = heads(value->forward(h));
    at::Tensor scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(dh));
    at::Tensor masked = torch::ones({t, t}, x.options().dtype(torch::kBool)).triu(1);
    if (padded.defined()) masked = torch::logical_or(masked, padded.view({b, 1, 1, t}));
    const at::Tensor attention = drop->forward(torch::softmax(scores.masked_fill(masked, -1e9), -1));
    const at::Tensor context = torch::matmul(attention, v).transpose(1, 2).reshape({b, t, kDim});
    x = x + drop->forward(proj->forward(context));
    x = x + drop->forward(fc2->forward(torch::gelu(fc1->forward(ln2->forward(x)))));
    return torch::matmul(ln_f->forward(x), tok->weight.t());  // weight tying
  }

 public:
  nn::Embedding tok{nullptr}, pos{nullptr};
  nn::LayerNorm ln1{nullptr}, ln2{nullptr}, ln_f{nullptr};
  nn::Linear query{nullptr}, key{nullptr}, value{nullptr}, proj{nullptr}, fc1{nullptr}, fc2{nullptr};
  nn::Dropout drop{nullptr};
};

// 160 windows of kBlock tokens and their next tokens from sequences that count up by a step of
// 1 or 2 modulo kVocab from a random start: a pattern that the model can learn and continue.
inline std::shared_ptr<TensorDataset> counting_data() {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(19);
  const int64_t n = 160, t = TinyGpt::kBlock;
  const at::Tensor start = at::randint(0, TinyGpt::kVocab, {n, 1}, gen);
  const at::Tensor step = at::randint(1, 3, {n, 1}, gen);
  const at::Tensor seq = (start + step * at::arange(t + 1).unsqueeze(0)).remainder(TinyGpt::kVocab);
  return std::make_shared<TensorDataset>(seq.slice(1, 0, t).contiguous(), seq.slice(1, 1, t + 1).contiguous());
}

}  // namespace fulgur::zoo
