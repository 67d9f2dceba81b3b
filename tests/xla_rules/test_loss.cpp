// SPDX-License-Identifier: Apache-2.0
// Per-op tests of the loss rules (rules/loss.cpp) and the losses fulgur composes on the Lazy key.
// Tolerances and method: xla_rules/lazy_ops.h.

#include "xla_rules/lazy_ops.h"

using namespace xla_rules;
using torch::indexing::None;
using torch::indexing::Slice;

// binary_cross_entropy (mean, sum, none; with weights; inputs at 0 and 1, where libtorch clamps
// the log at -100) and binary_cross_entropy_with_logits (log_sigmoid_forward, sigmoid), with
// their backwards.
TEST(XlaOps, BinaryCrossEntropyAndItsBackward) {
  torch::manual_seed(10);
  namespace F = torch::nn::functional;
  const auto p = torch::rand({6, 5}) * 0.98 + 0.01, y = torch::rand({6, 5});
  Options o;
  o.grad_inputs = 1;
  for (const auto& [name, reduction] : std::vector<std::pair<std::string, F::BinaryCrossEntropyFuncOptions::reduction_t>>{
           {"mean", torch::kMean}, {"sum", torch::kSum}, {"none", torch::kNone}}) {
    check_op("bce " + name, [reduction = reduction](const auto& x) {
      return F::binary_cross_entropy(x[0], x[1], F::BinaryCrossEntropyFuncOptions().reduction(reduction));
    }, {p, y}, o);
    check_op("bce weighted " + name, [reduction = reduction](const auto& x) {
      return F::binary_cross_entropy(x[0], x[1], F::BinaryCrossEntropyFuncOptions().reduction(reduction).weight(x[2]));
    }, {p, y, torch::rand({5})}, o);
  }
  Options forward_only;
  forward_only.backward = false;
  check_op("bce at 0 and 1", [](const auto& x) {
    return F::binary_cross_entropy(x[0], x[1], F::BinaryCrossEntropyFuncOptions().reduction(torch::kNone));
  }, {torch::tensor({0.0f, 1.0f, 0.0f, 1.0f, 0.5f}), torch::tensor({0.0f, 1.0f, 1.0f, 0.0f, 0.5f})}, forward_only);
  check_op("bce bf16", [](const auto& x) { return F::binary_cross_entropy(x[0], x[1]); },
           {p.to(torch::kBFloat16), y.to(torch::kBFloat16)}, bf16_options(o));
  check_op("bce with logits", [](const auto& x) { return F::binary_cross_entropy_with_logits(x[0], x[1]); },
           {torch::randn({6, 5}) * 4, y}, o);
  check_op("log_sigmoid", [](const auto& x) { return torch::log_sigmoid(x[0]); }, {torch::randn({6, 5}) * 10});
}

// smooth_l1_loss with beta 1, 0.5 and 0 (the L1 loss), each reduction, with its backward; values
// on both sides of beta and ties at ±beta.
TEST(XlaOps, SmoothL1LossAndItsBackward) {
  torch::manual_seed(11);
  namespace F = torch::nn::functional;
  const auto a = torch::randn({8, 3}) * 2, b = torch::randn({8, 3});
  for (double beta : {1.0, 0.5, 0.0}) {
    for (const auto& [name, reduction] : std::vector<std::pair<std::string, F::SmoothL1LossFuncOptions::reduction_t>>{
             {"mean", torch::kMean}, {"sum", torch::kSum}, {"none", torch::kNone}}) {
      check_op("beta " + std::to_string(beta) + " " + name, [beta, reduction = reduction](const auto& x) {
        return F::smooth_l1_loss(x[0], x[1], F::SmoothL1LossFuncOptions().reduction(reduction), beta);
      }, {a, b});
    }
  }
  check_op("ties at beta", [](const auto& x) {
    return F::smooth_l1_loss(x[0], x[1], F::SmoothL1LossFuncOptions().reduction(torch::kSum), 0.5);
  }, {torch::tensor({0.5f, -0.5f, 0.0f, 2.0f}), torch::zeros({4})});
  check_op("bf16", [](const auto& x) { return F::smooth_l1_loss(x[0], x[1]); },
           {a.to(torch::kBFloat16), b.to(torch::kBFloat16)}, bf16_options());
}

// Ops the lazy core has no node for, given Lazy kernels of fulgur's (src/xla/lazy_views.cpp)
// that compose them from lowered ops: nothing runs on the host any more.
TEST(XlaOps, MseLossArgmaxAndClampMaxStayOnXla) {
  torch::manual_seed(13);
  namespace F = torch::nn::functional;
  const auto a = torch::randn({8, 3}) * 2, b = torch::randn({8, 3});
  for (const auto& [name, reduction] : std::vector<std::pair<std::string, F::MSELossFuncOptions::reduction_t>>{
           {"mean", torch::kMean}, {"sum", torch::kSum}, {"none", torch::kNone}}) {
    check_op("mse_loss " + name, [reduction = reduction](const auto& x) {
      return F::mse_loss(x[0], x[1], F::MSELossFuncOptions().reduction(reduction));
    }, {a, b});
  }
  check_op("mse_loss bf16", [](const auto& x) { return F::mse_loss(x[0], x[1]); },
           {a.to(torch::kBFloat16), b.to(torch::kBFloat16)}, bf16_options());
  Options forward;
  forward.backward = false;
  // Ties (the first wins) and NaN (the first NaN wins), along each dim and over everything.
  const auto ties = torch::tensor({{1.0f, 3.0f, 3.0f}, {2.0f, 2.0f, -1.0f}, {0.0f, NAN, 5.0f}, {NAN, 1.0f, NAN}});
  for (const auto& x : {a, ties}) {
    check_op("argmax dim 1", [](const auto& t) { return t[0].argmax(1); }, {x}, forward);
    check_op("argmax dim 0 keepdim", [](const auto& t) { return t[0].argmax(0, true); }, {x}, forward);
    check_op("argmax of all", [](const auto& t) { return t[0].argmax(); }, {x}, forward);
    check_op("argmax of all keepdim", [](const auto& t) { return t[0].argmax(std::nullopt, true); }, {x}, forward);
  }
  check_op("argmax int", [](const auto& t) { return t[0].argmax(1); }, {torch::tensor({{1, 7, 7}, {4, 0, 4}})}, forward);
  check_op("accuracy as a metric computes it", [](const auto& t) {
    return t[0].argmax(1).eq(t[1]).to(torch::kFloat32).mean();
  }, {a, torch::tensor({0, 1, 2, 0, 1, 2, 0, 1})}, forward);
  // Forward only here: its backward calls where and is tested with it
  // (XlaOps.WhereBroadcastsPromotesAndItsBackward).
  check_op("clamp_max", [](const auto& x) { return x[0].clamp_max(0.5); }, {torch::tensor({-1.0f, 0.5f, 2.0f, NAN, INFINITY})},
           forward);
}
