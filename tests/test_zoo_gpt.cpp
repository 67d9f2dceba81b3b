// SPDX-License-Identifier: Apache-2.0
// The zoo's GPT-style decoder (tests/zoo/gpt.h): trained on xla as every zoo model is
// (zoo::check_model: no fallback, eager's losses and parameters within 1e-4 relative + 1e-5
// absolute, no new graph after warm-up), and its generation on xla: on the device with no
// fallback, one graph per generation step whatever the number of tokens, greedy tokens equal to
// eager's.
//
// Each test runs in its own process (CTest), so the backend's counters start at zero.

#include "zoo/check.h"
#include "zoo/gpt.h"

#include <fulgur/xla/random.h>

#include <gtest/gtest.h>

using namespace fulgur;
using namespace fulgur::zoo;

namespace {

// Two prompts of 3 tokens.
at::Tensor prompt() { return torch::tensor({3, 4, 5, 7, 9, 1}, torch::kLong).reshape({2, 3}); }

// Greedy generation without a window: the model run on the whole sequence so far, cropped to
// its last kBlock tokens (charlm's generate); on the CPU.
at::Tensor greedy_reference(TinyGpt& model, at::Tensor ids, int64_t n) {
  torch::NoGradGuard no_grad;
  model.eval();
  const int64_t p = ids.size(1);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = ids.size(1), c = std::min(t, TinyGpt::kBlock);
    const at::Tensor logits = model.forward(ids.slice(1, t - c, t)).select(1, c - 1);
    ids = torch::cat({ids, logits.argmax(-1, true)}, 1);
  }
  return ids.slice(1, p, p + n);
}

// Graphs XLA compiled while `f` ran.
int64_t graphs_compiled_by(const std::function<void()>& f) {
  const int64_t before = xla::metrics().xla_graphs_compiled;
  f();
  return xla::metrics().xla_graphs_compiled - before;
}

}  // namespace

TEST(Zoo, GptDecoderWithWeightTyingCausalAttentionAndDropout) {
  check_model([](double p) { return std::make_shared<TinyGpt>(p); }, counting_data(), 1.0, 0.2);
}

// The window's padding and positions are right: greedy tokens through the window equal those
// of the model run on the unpadded, cropped sequence, before and after the window fills up.
TEST(ZooGpt, GreedyGenerationThroughTheWindowEqualsTheCroppedSequences) {
  torch::manual_seed(5);
  TinyGpt model(0);
  const int64_t n = 2 * TinyGpt::kBlock;
  EXPECT_TRUE(torch::equal(model.generate(prompt(), n), greedy_reference(model, prompt(), n)));
  // A prompt longer than the window keeps its last kBlock tokens.
  const at::Tensor longer = torch::arange(2 * TinyGpt::kBlock + 1).remainder(TinyGpt::kVocab).unsqueeze(0);
  EXPECT_TRUE(torch::equal(model.generate(longer, 4), greedy_reference(model, longer, 4)));
  EXPECT_THROW(model.generate(torch::zeros({2, 0}, torch::kLong), 4), std::invalid_argument);
  EXPECT_THROW(model.generate(prompt(), 0), std::invalid_argument);
}

// Greedy generation on xla: no fallback, two graphs for n tokens (the step's and the one that
// puts the n tokens together), none more for a second generation and only the last one for
// another n; the tokens equal eager's on the CPU.
TEST(ZooGpt, GreedyGenerationOnXlaStaysOnTheDeviceInBoundedGraphsAndEqualsEager) {
  torch::manual_seed(5);
  TinyGpt model(0.2);
  const at::Tensor eager = model.generate(prompt(), 20);
  move_module(model, xla::backend().device());
  xla::mark_step();  // the copies of the weights run as a graph of their own
  const xla::BackendMetrics before = xla::metrics();
  at::Tensor on_xla;
  EXPECT_EQ(graphs_compiled_by([&] { on_xla = model.generate(prompt(), 20).cpu(); }), 2) << xla::metrics_report();
  EXPECT_EQ(left_xla(before, 0), "") << xla::metrics_report();
  EXPECT_TRUE(torch::equal(on_xla, eager)) << "xla\n" << on_xla << "\neager\n" << eager;
  EXPECT_EQ(graphs_compiled_by([&] { model.generate(prompt(), 20).cpu(); }), 0) << xla::metrics_report();
  EXPECT_EQ(graphs_compiled_by([&] { model.generate(prompt(), 7).cpu(); }), 1) << xla::metrics_report();
  EXPECT_TRUE(model.is_training()) << "generate leaves the model's mode as it found it";
}

// Sampling at a temperature on xla draws from the device generator: no fallback, bounded
// graphs, tokens in the vocabulary, the same tokens for the same seed and others for another.
TEST(ZooGpt, SamplingOnXlaDrawsFromTheDeviceGeneratorReproducibly) {
  torch::manual_seed(5);
  TinyGpt model(0);
  move_module(model, xla::backend().device());
  xla::mark_step();
  auto sample = [&](uint64_t seed) {
    xla::manual_seed(seed);
    return model.generate(prompt(), 20, 4.0).cpu();
  };
  const xla::BackendMetrics before = xla::metrics();
  at::Tensor first;
  EXPECT_LE(graphs_compiled_by([&] { first = sample(1); }), 2) << xla::metrics_report();
  EXPECT_EQ(left_xla(before, 0), "") << xla::metrics_report();
  EXPECT_TRUE(first.ge(0).all().item<bool>() && first.lt(TinyGpt::kVocab).all().item<bool>()) << first;
  EXPECT_EQ(graphs_compiled_by([&] { EXPECT_TRUE(torch::equal(sample(1), first)); }), 0) << xla::metrics_report();
  EXPECT_FALSE(torch::equal(sample(2), first)) << "another seed drew the same 40 tokens";
  // Greedy and sampled tokens differ somewhere: the temperature is not ignored.
  EXPECT_FALSE(torch::equal(model.generate(prompt(), 20).cpu(), first));
}
