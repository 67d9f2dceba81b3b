// SPDX-License-Identifier: Apache-2.0
// Per-op tests of the upsampling rules (rules/upsample.cpp): nearest and bilinear.
// Tolerances and method: xla_rules/lazy_ops.h.

#include "xla_rules/lazy_ops.h"

using namespace xla_rules;
using torch::indexing::None;
using torch::indexing::Slice;

// upsample_nearest2d by whole factors, as nn::Upsample and F::interpolate call it: 2 x 2 by
// scale factors, 2 x 3 and 1 x 2 by output sizes, 4 x 4 by scale factors (libtorch's float
// source-index formula, which the rule checks gives a whole-factor repeat), bfloat16, and ±inf
// and NaN copied through; with its backward (each input's copies summed).
TEST(XlaOps, UpsampleNearestAndItsBackward) {
  torch::manual_seed(8);
  namespace F = torch::nn::functional;
  auto by_scale = [](double f) {
    return [f](const auto& x) {
      return F::interpolate(x[0], F::InterpolateFuncOptions().scale_factor(std::vector<double>{f, f}).mode(torch::kNearest));
    };
  };
  auto by_size = [](int64_t h, int64_t w) {
    return [h, w](const auto& x) {
      return F::interpolate(x[0], F::InterpolateFuncOptions().size(std::vector<int64_t>{h, w}).mode(torch::kNearest));
    };
  };
  check_op("scale 2", by_scale(2), {torch::randn({2, 3, 4, 5})});
  check_op("size 8 x 15 of 4 x 5", by_size(8, 15), {torch::randn({1, 2, 4, 5})});
  check_op("size 3 x 8 of 3 x 4", by_size(3, 8), {torch::randn({2, 1, 3, 4})});
  check_op("scale 4", by_scale(4), {torch::randn({1, 2, 3, 3})});
  check_op("bf16 scale 2", by_scale(2), {torch::randn({1, 2, 3, 4}).to(torch::kBFloat16)}, bf16_options());
  Options forward;
  forward.backward = false;
  check_op("edges", by_scale(2), {edges().reshape({1, 1, 3, 4})}, forward);
}

// upsample_bilinear2d, as nn::Upsample and F::interpolate call it, with align_corners false and
// true: twice the size, sizes that are no whole factor (3 x 4 to 7 x 5), a smaller output (5 x 7
// to 2 x 3), a scale factor of 1.5 passed on as the kernel's scales, an output of one row,
// float64 and bfloat16, with the backwards; ±inf and NaN forward (each output reads only its
// two taps). A convolution followed by bilinear upsampling trains on xla as on the CPU.
TEST(XlaOps, UpsampleBilinearBothAlignmentsAndItsBackward) {
  torch::manual_seed(9);
  namespace F = torch::nn::functional;
  auto by_size = [](int64_t h, int64_t w, bool align) {
    return [h, w, align](const auto& x) {
      return F::interpolate(x[0], F::InterpolateFuncOptions().size(std::vector<int64_t>{h, w}).mode(torch::kBilinear).align_corners(align));
    };
  };
  auto by_scale = [](double f, bool align) {
    return [f, align](const auto& x) {
      return F::interpolate(x[0], F::InterpolateFuncOptions()
                                      .scale_factor(std::vector<double>{f, f})
                                      .mode(torch::kBilinear)
                                      .align_corners(align)
                                      .recompute_scale_factor(false));
    };
  };
  for (bool align : {false, true}) {
    const std::string a = align ? " align_corners" : "";
    check_op("scale 2" + a, by_scale(2, align), {torch::randn({2, 3, 4, 5})});
    check_op("7 x 5 of 3 x 4" + a, by_size(7, 5, align), {torch::randn({1, 2, 3, 4})});
    check_op("2 x 3 of 5 x 7" + a, by_size(2, 3, align), {torch::randn({2, 1, 5, 7})});
    check_op("scale 1.5" + a, by_scale(1.5, align), {torch::randn({1, 2, 4, 3})});
    check_op("1 x 4 of 3 x 2" + a, by_size(1, 4, align), {torch::randn({1, 1, 3, 2})});
    check_op("float64" + a, by_size(6, 9, align), {torch::randn({1, 2, 4, 5}, torch::kDouble)}, Options{{1e-12, 1e-12}});
    check_op("bf16" + a, by_scale(2, align), {torch::randn({1, 2, 3, 4}).to(torch::kBFloat16)}, bf16_options());
    Options forward;
    forward.backward = false;
    check_op("edges" + a, by_size(5, 7, align), {edges().reshape({1, 1, 3, 4})}, forward);
  }

  struct Net : torch::nn::Module {
    Net() { conv = register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(2, 3, 3).padding(1))); }
    torch::nn::Conv2d conv{nullptr};
  };
  const auto eager = check_training("convolution then bilinear upsampling", [] { return std::make_shared<Net>(); },
                                    [](torch::nn::Module& m, const torch::Tensor& x) {
                                      const auto up = F::interpolate(static_cast<Net&>(m).conv->forward(x),
                                                                     F::InterpolateFuncOptions()
                                                                         .scale_factor(std::vector<double>{2, 2})
                                                                         .mode(torch::kBilinear)
                                                                         .align_corners(false));
                                      return (up - 0.5).square().mean();
                                    },
                                    torch::randn({4, 2, 4, 4}));
  EXPECT_TRUE(eager.empty()) << xla::metrics_report();
}
