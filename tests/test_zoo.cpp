// SPDX-License-Identifier: Apache-2.0
// The model zoo (tests/zoo/models.h) trained 20 steps on xla with the Trainer. Each must stay on
// XLA (no graph kept on TorchScript, no op run on the host; reading logged metrics back once at
// the end is allowed), end where eager training ends, and compile no new graph after its first
// steps (a changing learning rate, a new batch must not recompile): zoo::check_model.
// Dropout draws from the device generator on xla and from the CPU generator on eager, so the
// comparison runs with p = 0 (torch's dropout is then the identity and draws nothing); the same
// model with p > 0 is checked to stay on XLA and train. The VAE's p switches its
// reparameterization noise (randn_like) the same way. The GPT-style decoder and its generation
// are in test_zoo_gpt.cpp.
//
// Tolerances: every loss and final parameter within 1e-4 relative + 1e-5 absolute of eager's
// (float32: sums in another order, XLA's transcendental functions, compounded over 20 steps);
// logged metrics within 1e-5.
//
// Each test runs in its own process (CTest), so the backend's counters start at zero.

#include "zoo/check.h"

#include <gtest/gtest.h>

using namespace fulgur::zoo;

TEST(Zoo, MlpWithDropoutAdamWClippingAndAStepScheduler) {
  check_model([](double p) { return std::make_shared<Mlp>(p); }, regression_data(160), 0.5, 0.2);
}

TEST(Zoo, ResidualCnnWithBatchNormAdaptivePoolAndDropout) {
  check_model([](double p) { return std::make_shared<ResidualCnn>(p); }, image_data(), std::nullopt, 0.3);
}

TEST(Zoo, TransformerEncoderWithMasksLayerNormGeluAndDropout) {
  check_model([](double p) { return std::make_shared<TinyTransformer>(p); }, token_data(), 1.0, 0.2);
}

TEST(Zoo, RobustRegressionWithClampWhereAndLoggedTopkMetrics) {
  check_model([](double p) { return std::make_shared<RobustRegression>(p); }, regression_data(160), 1.0, 0.2,
              {"argmax_hit", "top3_positive", "sign_agreement"});
}

TEST(Zoo, LstmSequenceRegressorWithSlicingCatAndGates) {
  check_model([](double p) { return std::make_shared<SequenceRegressor>(p); }, sequence_data(), 1.0, 0.3);
}

// p here switches the reparameterization noise on (randn_like on the device) for the second xla
// run; the compared run has eps = 0.
TEST(Zoo, VaeWithSigmoidBinaryCrossEntropyAndReparameterization) {
  check_model([](double p) { return std::make_shared<Vae>(p); }, vae_data(), 5.0, 1.0);
}

TEST(Zoo, UNetWithUpsamplingSkipConnectionsAndMseLoss) {
  check_model([](double p) { return std::make_shared<TinyUNet>(p); }, denoising_data(), 1.0, 0.2);
}
