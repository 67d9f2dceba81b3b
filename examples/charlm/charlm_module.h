// SPDX-License-Identifier: Apache-2.0
#pragma once
// The charlm example's model and data: a small GPT-style character model
// (token and position embeddings, pre-norm blocks of causal self-attention
// and an MLP, a final layer norm and a linear head) on the King James Bible.
// Shared by the example, the tests and the benchmarks; bench/reference.py
// builds the same model in Python with the same parameter names.

#include <fulgur/data/text.h>
#include <fulgur/fulgur.h>

#include <torch/torch.h>

#include <cmath>
#include <string>

namespace charlm {

struct Config {
  int64_t vocab_size = 0;
  int64_t block_size = 64;
  int64_t n_embd = 128;
  int64_t n_head = 4;
  int64_t n_layer = 2;
  double lr = 3e-3;
};

// Causal self-attention from linear maps, batched matmuls and a softmax. The
// query, key and value maps are separate rather than one fused map that is
// then split: splitting views (chunk, narrow) have no lazy kernel in
// libtorch 1.13, and torch::nn::MultiheadAttention aborts on lazy tensors.
struct SelfAttentionImpl : torch::nn::Module {
  SelfAttentionImpl(int64_t n_embd, int64_t n_head) : n_head(n_head) {
    if (n_embd % n_head != 0) {
      throw std::invalid_argument("charlm: n_embd=" + std::to_string(n_embd) + " must be a multiple of n_head=" +
                                  std::to_string(n_head));
    }
    query = register_module("query", torch::nn::Linear(n_embd, n_embd));
    key = register_module("key", torch::nn::Linear(n_embd, n_embd));
    value = register_module("value", torch::nn::Linear(n_embd, n_embd));
    proj = register_module("proj", torch::nn::Linear(n_embd, n_embd));
  }

  // x: [B, T, C]; mask: [T, T] additive (0 on and below the diagonal, -inf above).
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& mask) {
    const int64_t b = x.size(0), t = x.size(1), c = x.size(2), hd = c / n_head;
    auto heads = [&](const torch::Tensor& y) { return y.view({b, t, n_head, hd}).transpose(1, 2); };
    auto q = heads(query->forward(x));
    auto k = heads(key->forward(x));
    auto v = heads(value->forward(x));
    auto att = torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(hd)));
    att = torch::softmax(att + mask, -1);
    auto y = torch::matmul(att, v).transpose(1, 2).contiguous().view({b, t, c});
    return proj->forward(y);
  }

  int64_t n_head;
  torch::nn::Linear query{nullptr}, key{nullptr}, value{nullptr}, proj{nullptr};
};
TORCH_MODULE(SelfAttention);

struct BlockImpl : torch::nn::Module {
  BlockImpl(int64_t n_embd, int64_t n_head) {
    ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({n_embd})));
    attn = register_module("attn", SelfAttention(n_embd, n_head));
    ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({n_embd})));
    fc1 = register_module("fc1", torch::nn::Linear(n_embd, 4 * n_embd));
    fc2 = register_module("fc2", torch::nn::Linear(4 * n_embd, n_embd));
  }

  torch::Tensor forward(torch::Tensor x, const torch::Tensor& mask) {
    x = x + attn->forward(ln1->forward(x), mask);
    return x + fc2->forward(torch::gelu(fc1->forward(ln2->forward(x))));
  }

  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  SelfAttention attn{nullptr};
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(Block);

struct CharLM : fulgur::LightningModule {
  explicit CharLM(Config cfg) : fulgur::LightningModule("CharLM"), cfg(cfg) {
    if (cfg.vocab_size < 1) throw std::invalid_argument("charlm: vocab_size must be >= 1");
    tok_emb = register_module("tok_emb", torch::nn::Embedding(cfg.vocab_size, cfg.n_embd));
    pos_emb = register_module("pos_emb", torch::nn::Embedding(cfg.block_size, cfg.n_embd));
    blocks = register_module("blocks", torch::nn::ModuleList());
    for (int64_t i = 0; i < cfg.n_layer; ++i) blocks->push_back(Block(cfg.n_embd, cfg.n_head));
    ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.n_embd})));
    head = register_module("head", torch::nn::Linear(torch::nn::LinearOptions(cfg.n_embd, cfg.vocab_size).bias(false)));
    // GPT-2's initialisation: normal(0, 0.02) weights, zero biases.
    torch::NoGradGuard no_grad;
    for (auto& p : named_parameters()) {
      if (p.key().find("ln") != std::string::npos) continue;
      if (p.key().size() > 5 && p.key().compare(p.key().size() - 5, 5, ".bias") == 0) {
        p.value().zero_();
      } else {
        p.value().normal_(0.0, 0.02);
      }
    }
    mask = register_buffer("mask", causal_mask(cfg.block_size));
    auto hp = fulgur::make_dict();
    hp.insert("vocab_size", cfg.vocab_size);
    hp.insert("block_size", cfg.block_size);
    hp.insert("n_embd", cfg.n_embd);
    hp.insert("n_head", cfg.n_head);
    hp.insert("n_layer", cfg.n_layer);
    hp.insert("lr", cfg.lr);
    save_hyperparameters(hp);
  }

  static torch::Tensor causal_mask(int64_t t) {
    return torch::full({t, t}, -std::numeric_limits<float>::infinity()).triu(1);
  }

  // idx: [B, T] token ids, T <= block_size -> logits [B, T, vocab].
  torch::Tensor forward(const torch::Tensor& idx) {
    const int64_t t = idx.size(1);
    // Full windows use the position table and the mask as they are (no
    // arange or slice in the traced graph); a shorter input (sampling) takes
    // their first t rows.
    using torch::indexing::Slice;
    const bool full = t == cfg.block_size;
    auto x = tok_emb->forward(idx) + (full ? pos_emb->weight : pos_emb->weight.index({Slice(0, t)}));
    auto m = full ? mask : mask.index({Slice(0, t), Slice(0, t)});
    for (const auto& block : *blocks) x = block->as<Block>()->forward(x, m);
    return head->forward(ln_f->forward(x));
  }

  torch::Tensor loss(const fulgur::Batch& batch) {
    auto logits = forward(batch.data);
    return torch::cross_entropy_loss(logits.view({-1, logits.size(-1)}), batch.target.view({-1}));
  }

  fulgur::StepOutput training_step(const fulgur::Batch& batch, int64_t) override {
    auto l = loss(batch);
    log("train_loss", l, fulgur::LogOptions().prog_bar(true));
    return l;
  }

  fulgur::StepOutput validation_step(const fulgur::Batch& batch, int64_t) override {
    log("val_loss", loss(batch), fulgur::LogOptions().prog_bar(true).sync_dist(true));
    return {};
  }

  fulgur::OptimizerConfig configure_optimizers() override {
    return std::make_shared<torch::optim::AdamW>(parameters(), torch::optim::AdamWOptions(cfg.lr));
  }

  // Samples `n` characters after `prompt` ids [1, P] on the module's device.
  torch::Tensor generate(torch::Tensor idx, int64_t n, double temperature = 0.8) {
    torch::NoGradGuard no_grad;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t t = idx.size(1);
      auto ctx = t <= cfg.block_size ? idx : idx.index({torch::indexing::Slice(), torch::indexing::Slice(t - cfg.block_size, t)});
      auto logits = forward(ctx).select(1, ctx.size(1) - 1) / temperature;
      auto next = torch::multinomial(torch::softmax(logits, -1), 1);
      idx = torch::cat({idx, next}, 1);
    }
    return idx;
  }

  Config cfg;
  torch::nn::Embedding tok_emb{nullptr}, pos_emb{nullptr};
  torch::nn::ModuleList blocks{nullptr};
  torch::nn::LayerNorm ln_f{nullptr};
  torch::nn::Linear head{nullptr};
  torch::Tensor mask;
};

// CharLM keeps its mask buffer in a member for forward(); moving the model to
// an xla (lazy) device must rebind that member too. This is the extension
// point for a module of one's own: the built-in modules are known already.
inline const bool kCharLMMoverRegistered = [] {
  fulgur::register_module_mover([](torch::nn::Module& m, const fulgur::TensorRemap& remap) {
    auto* lm = dynamic_cast<CharLM*>(&m);
    if (!lm) return false;
    remap(lm->mask);
    return true;
  });
  return true;
}();

// The text split into a training part (the first 90%) and a validation part.
struct DataModule : fulgur::DataModule {
  DataModule(std::string path, int64_t block_size, int64_t batch_size, uint64_t seed = 0)
      : path(std::move(path)), block_size(block_size), batch_size(batch_size), seed(seed) {
    text = fulgur::CharDataset::from_file(this->path, block_size);
  }

  void setup(const std::string&) override {
    const int64_t n = text->size();
    const int64_t n_train = n * 9 / 10;
    train = std::make_shared<fulgur::SubsetDataset>(text, 0, n_train);
    // Windows that start in the last tenth; a few hundred batches are enough
    // for a validation loss, so the validation loader is limited by the trainer.
    val = std::make_shared<fulgur::SubsetDataset>(text, n_train + block_size, n - n_train - block_size);
  }
  std::shared_ptr<fulgur::BatchSource> train_dataloader() override {
    return std::make_shared<fulgur::DataLoader>(
        train, fulgur::DataLoaderOptions(batch_size).shuffle(true).seed(seed).drop_last(true));
  }
  std::shared_ptr<fulgur::BatchSource> val_dataloader() override {
    return std::make_shared<fulgur::DataLoader>(val, fulgur::DataLoaderOptions(batch_size).shuffle(true).seed(seed));
  }

  std::string path;
  int64_t block_size, batch_size;
  uint64_t seed;
  std::shared_ptr<fulgur::CharDataset> text;
  std::shared_ptr<fulgur::Dataset> train, val;
};

}  // namespace charlm
