// SPDX-License-Identifier: Apache-2.0
// Per-op tests of the random rules (rules/random.cpp): the device generator, dropout, seeding.
// Tolerances and method: xla_rules/lazy_ops.h.

#include "xla_rules/lazy_ops.h"

using namespace xla_rules;
using torch::indexing::None;
using torch::indexing::Slice;

namespace {

// The uniform numbers the device generator gives a draw of `n` from `state`, by the host
// function (src/xla/threefry.h), as float32.
torch::Tensor host_uniform(const torch::Tensor& state, int64_t n, int digits = 24) {
  const auto key = static_cast<uint64_t>(state[0].item<int64_t>()), offset = static_cast<uint64_t>(state[1].item<int64_t>());
  torch::Tensor out = torch::empty({n});
  for (int64_t i = 0; i < n; ++i)
    out[i] = xla::random::uniform_from_word(xla::random::words(key, offset, static_cast<uint64_t>(i)).first, digits);
  return out;
}

torch::TensorOptions on_xla(torch::Dtype dtype = torch::kFloat) { return torch::TensorOptions(dtype).device(xla::backend().device()); }

}  // namespace

// The host generator is Random123's threefry2x32_20 (its known-answer vectors), and the device
// draws its bits exactly: rand of float32 and bfloat16 (24 and 8 significand bits of the same
// words), and randn within float32 rounding of the host's Box-Muller. Each draw advances the
// state's offset by its element count; nothing leaves XLA.
TEST(XlaOps, DeviceGeneratorDrawsTheHostThreefryBits) {
  using xla::random::threefry2x32;
  EXPECT_EQ(threefry2x32(0, 0, 0, 0), std::make_pair(0x6b200159u, 0x99ba4efeu));
  EXPECT_EQ(threefry2x32(0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff), std::make_pair(0x1cb996fcu, 0xbb002be7u));
  EXPECT_EQ(threefry2x32(0x13198a2e, 0x03707344, 0x243f6a88, 0x85a308d3), std::make_pair(0xc4923a9cu, 0x483df7a0u));

  xla::manual_seed(11);
  const torch::Tensor s0 = xla::rng_state();
  ASSERT_EQ(s0[1].item<int64_t>(), 0);
  const xla::BackendMetrics before = xla::metrics();
  torch::Tensor u = torch::rand({37, 3}, on_xla());
  torch::Tensor h = torch::rand({5, 7}, on_xla(torch::kBFloat16));
  torch::Tensor z = torch::randn({1000}, on_xla());
  xla::mark_step();
  EXPECT_TRUE(torch::equal(u.cpu().reshape({-1}), host_uniform(s0, 111))) << "float32 rand";
  torch::Tensor s1 = s0.clone();
  s1[1] = 111;
  EXPECT_TRUE(torch::equal(h.cpu().reshape({-1}), host_uniform(s1, 35, 8).to(torch::kBFloat16))) << "bfloat16 rand";
  const torch::Tensor s3 = xla::rng_state();
  EXPECT_EQ(s3[0].item<int64_t>(), s0[0].item<int64_t>());
  EXPECT_EQ(s3[1].item<int64_t>(), 111 + 35 + 1000);
  // The normals: Box-Muller of each element's two words, on the host in float32.
  const auto key = static_cast<uint64_t>(s0[0].item<int64_t>());
  torch::Tensor want = torch::empty({1000});
  for (int64_t i = 0; i < 1000; ++i) {
    const auto [w0, w1] = xla::random::words(key, 146, static_cast<uint64_t>(i));
    const float u1 = xla::random::uniform_from_word(w0, 24), u2 = xla::random::uniform_from_word(w1, 24);
    want[i] = std::sqrt(-2.0f * std::log(1.0f - u1)) * std::cos(u2 * static_cast<float>(2 * M_PI));
  }
  expect_close(z.cpu(), want, {1e-5, 1e-5}, "randn");
  EXPECT_EQ(new_fallbacks(before, {}), "") << xla::metrics_report();
  EXPECT_GT(xla::metrics().xla_executions, before.xla_executions);
}

// A graph kept on TorchScript (aten::cos has no rule) draws with the host kernels of the same
// generator: the same bits as XLA would, and the state advances the same way.
TEST(XlaOps, AGraphOnTorchScriptDrawsTheSameBits) {
  xla::manual_seed(5);
  const torch::Tensor s0 = xla::rng_state();
  const xla::BackendMetrics before = xla::metrics();
  torch::Tensor u = torch::rand({64}, on_xla());
  torch::Tensor c = u.cos();
  xla::mark_step();
  EXPECT_GT(xla::metrics().xla_fallbacks.count("aten::cos"), 0u) << "the graph should have stayed on TorchScript";
  EXPECT_GT(xla::metrics().ts_fallback_executions, before.ts_fallback_executions);
  EXPECT_TRUE(torch::equal(u.cpu(), host_uniform(s0, 64)));
  EXPECT_TRUE(torch::allclose(c.cpu(), host_uniform(s0, 64).cos()));
  EXPECT_EQ(xla::rng_state()[1].item<int64_t>(), 64);
}

// uniform_ (rand, rand_like, uniform_(from, to)) and normal_ (randn, randn_like, normal_(mean,
// std)) of a million elements have their distribution's mean and variance (5 standard errors),
// in float32 and bfloat16, all on XLA.
TEST(XlaOps, UniformAndNormalHaveTheirMomentsOnXla) {
  xla::manual_seed(1);
  const xla::BackendMetrics before = xla::metrics();
  const int64_t n = 1 << 20;
  const torch::Tensor like = torch::zeros({1024, 1024}, on_xla());
  struct Case {
    std::string what;
    torch::Tensor x;
    double mean, var;
  };
  std::vector<Case> cases = {
      {"rand_like", torch::rand_like(like), 0.5, 1.0 / 12},
      {"randn_like", torch::randn_like(like), 0.0, 1.0},
      {"uniform_(-2, 3)", torch::empty({n}, on_xla()).uniform_(-2, 3), 0.5, 25.0 / 12},
      {"normal_(1, 2)", torch::empty({n}, on_xla()).normal_(1, 2), 1.0, 4.0},
      {"bfloat16 rand", torch::rand({n}, on_xla(torch::kBFloat16)), 0.5 - 1.0 / 512, 1.0 / 12},
      {"bfloat16 randn", torch::randn({n}, on_xla(torch::kBFloat16)), 0.0, 1.0},
  };
  xla::mark_step();
  for (const Case& c : cases) {
    const torch::Tensor x = c.x.cpu().to(torch::kDouble);
    const double mean = x.mean().item<double>(), var = x.var().item<double>();
    // Standard errors of the mean (sqrt(var / n)) and of the variance (var * sqrt(2 / n) for a
    // normal; smaller for a uniform).
    EXPECT_NEAR(mean, c.mean, 5 * std::sqrt(c.var / n)) << c.what;
    EXPECT_NEAR(var, c.var, 5 * c.var * std::sqrt(2.0 / n) + 1e-3 * c.var) << c.what;
    if (c.what.find("rand") != std::string::npos && c.what.find("randn") == std::string::npos) {
      EXPECT_GE(x.min().item<double>(), c.what == "uniform_(-2, 3)" ? -2.0 : 0.0) << c.what;
      EXPECT_LT(x.max().item<double>(), c.what == "uniform_(-2, 3)" ? 3.0 : 1.0) << c.what;
    }
  }
  EXPECT_EQ(new_fallbacks(before, {}), "") << xla::metrics_report();
}

// Dropout (aten::native_dropout and its backward) on XLA: about 1 - p of the elements kept (5
// standard errors), each kept one scaled by 1 / (1 - p), and the gradient is the upstream
// gradient through the same mask, scaled alike. bernoulli draws with its probabilities.
TEST(XlaOps, DropoutKeepsOneMinusPScalesAndItsBackwardUsesTheSameMask) {
  xla::manual_seed(2);
  const xla::BackendMetrics before = xla::metrics();
  const double p = 0.3;
  const int64_t n = 200000;
  const torch::Tensor x = (torch::rand({n}) + 0.5).to(xla::backend().device()).requires_grad_();
  const torch::Tensor upstream = torch::randn({n});
  const torch::Tensor y = torch::dropout(x, p, /*train=*/true);
  y.backward(upstream.to(xla::backend().device()));
  const torch::Tensor probs = torch::full({n}, 0.2).to(xla::backend().device());
  const torch::Tensor b = torch::bernoulli(probs);
  const torch::Tensor bp = torch::empty({n}, on_xla()).bernoulli_(0.9);
  xla::mark_step();
  const torch::Tensor xc = x.detach().cpu(), yc = y.detach().cpu(), g = x.grad().cpu();
  const torch::Tensor kept = yc != 0;
  const double fraction = kept.to(torch::kDouble).mean().item<double>();
  EXPECT_NEAR(fraction, 1 - p, 5 * std::sqrt(p * (1 - p) / n));
  const float scale = static_cast<float>(1 / (1 - p));
  EXPECT_TRUE(torch::equal(yc, torch::where(kept, xc * scale, torch::zeros({n})))) << "kept elements scaled by 1 / (1 - p)";
  EXPECT_TRUE(torch::equal(g, torch::where(kept, upstream * scale, torch::zeros({n})))) << "the backward's mask is the forward's";
  for (const auto& [what, t, q] : {std::make_tuple("bernoulli(0.2)", b, 0.2), std::make_tuple("bernoulli_(0.9)", bp, 0.9)}) {
    const torch::Tensor c = t.cpu();
    EXPECT_TRUE(torch::equal(c, (c != 0).to(torch::kFloat))) << what << ": not only zeros and ones";
    EXPECT_NEAR(c.to(torch::kDouble).mean().item<double>(), q, 5 * std::sqrt(q * (1 - q) / n)) << what;
  }
  EXPECT_EQ(new_fallbacks(before, {}), "") << xla::metrics_report();
  EXPECT_GT(xla::metrics().xla_executions, before.xla_executions);
}

// The same seed gives the same bits, in one graph or across step marks; another seed or another
// rank gives other bits; a restored state gives the draws that followed it.
TEST(XlaOps, SameSeedSameBitsOtherSeedOrRankOtherBits) {
  auto draws = [] {
    torch::Tensor a = torch::rand({1000}, on_xla());
    xla::mark_step();
    torch::Tensor b = torch::dropout(torch::ones({1000}, on_xla()), 0.5, true);
    xla::mark_step();
    return std::make_pair(a.cpu(), b.cpu());
  };
  xla::manual_seed(3);
  const auto first = draws();
  EXPECT_FALSE(torch::equal(first.first, first.first.roll(1))) << "a draw of one value repeated";
  xla::manual_seed(3);
  const auto again = draws();
  EXPECT_TRUE(torch::equal(first.first, again.first));
  EXPECT_TRUE(torch::equal(first.second, again.second));
  xla::manual_seed(4);
  EXPECT_FALSE(torch::equal(first.first, draws().first)) << "another seed";
  {
    runtime::RankScope rank(1, 2);
    xla::manual_seed(3);
    EXPECT_FALSE(torch::equal(first.first, draws().first)) << "another rank";
  }
  xla::manual_seed(3);
  (void)torch::rand({10}, on_xla());
  const torch::Tensor state = xla::rng_state();
  const torch::Tensor next = torch::rand({1000}, on_xla()).cpu();
  xla::manual_seed(9);
  xla::set_rng_state(state);
  EXPECT_TRUE(torch::equal(next, torch::rand({1000}, on_xla()).cpu())) << "after set_rng_state";
  EXPECT_THROW(xla::set_rng_state(torch::zeros({3}, torch::kLong)), std::invalid_argument);
}

namespace {

// Linear, dropout(0.5), Linear, squared error, plain SGD; records each step's loss.
struct DropNet : LightningModule {
  DropNet() : LightningModule("DropNet") {
    fc1 = register_module("fc1", torch::nn::Linear(8, 32));
    fc2 = register_module("fc2", torch::nn::Linear(32, 1));
  }
  StepOutput training_step(const Batch& b, int64_t) override {
    const auto h = torch::dropout(torch::relu(fc1->forward(b.data)), 0.5, is_training());
    const auto d = fc2->forward(h) - b.target;
    const auto loss = (d * d).mean();
    losses.push_back(loss.detach());
    return loss;
  }
  OptimizerConfig configure_optimizers() override {
    return std::make_shared<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.05));
  }
  torch::Tensor recorded() const {
    std::vector<torch::Tensor> out;
    for (const auto& l : losses) out.push_back(l.cpu().reshape({1}));
    return torch::cat(out);
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  std::vector<torch::Tensor> losses;
};

// The losses of 2 epochs of DropNet on xla (10 steps each) with seed 5, resumed from `ckpt`
// when given; with `save_dir`, a checkpoint every 10 steps there.
torch::Tensor train_dropout(const std::string& ckpt = "", const std::string& save_dir = "") {
  fulgur::testing::TempDir dir;
  torch::manual_seed(7);
  DropNet net;
  std::vector<std::shared_ptr<Callback>> callbacks;
  if (!save_dir.empty())
    callbacks.push_back(std::make_shared<ModelCheckpoint>(
        ModelCheckpointOptions().dirpath(save_dir).every_n_train_steps(10).save_top_k(-1).filename("{step}")));
  Trainer t(TrainerOptions()
                .accelerator("xla")
                .devices(1)
                .max_epochs(2)
                .seed(5)
                .callbacks(callbacks)
                .default_root_dir(dir.path)
                .enable_progress_bar(false)
                .enable_checkpointing(!save_dir.empty())
                .logger(false)
                .num_sanity_val_steps(0));
  t.fit(net, std::make_shared<DataLoader>(fulgur::testing::regression_data(80), DataLoaderOptions(8)), nullptr, ckpt);
  return net.recorded();
}

}  // namespace

// A model with dropout trained on xla: two runs with the same seed have bit-identical losses (and
// their steps share graphs), a run resumed from a checkpoint continues with the losses of the
// uninterrupted run (the device generator's state is in the checkpoint), and nothing leaves XLA.
TEST(XlaOps, DropoutTrainingIsReproducibleAndResumesBitIdentically) {
  fulgur::testing::TempDir dir;
  const xla::BackendMetrics before = xla::metrics();
  const torch::Tensor a = train_dropout("", dir.path);
  EXPECT_EQ(new_fallbacks(before, {}), "") << xla::metrics_report();
  const int64_t compiled = xla::metrics().xla_graphs_compiled;
  const torch::Tensor b = train_dropout();
  // The generator's state is device data of a fixed shape, not a constant of each step: the
  // 20 steps share their graphs (each fit compiles its own anew, dropout or not).
  EXPECT_LT(xla::metrics().xla_graphs_compiled - compiled, 20) << "a graph per step";
  ASSERT_EQ(a.numel(), 20);
  EXPECT_TRUE(torch::equal(a, b)) << "two runs\n" << a << "\n" << b;
  std::string ckpt;
  for (const auto& f : std::filesystem::directory_iterator(dir.path))
    if (f.path().filename().string().find("step=10") != std::string::npos) ckpt = f.path().string();
  ASSERT_FALSE(ckpt.empty()) << "no checkpoint of step 10 in " << dir.path;
  const torch::Tensor resumed = train_dropout(ckpt);
  EXPECT_TRUE(torch::equal(resumed, a.slice(0, 10, 20))) << "resumed\n" << resumed << "\nuninterrupted\n" << a.slice(0, 10, 20);
}
