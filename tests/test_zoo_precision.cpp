// SPDX-License-Identifier: Apache-2.0
// Zoo models (tests/zoo/models.h) in bfloat16 on xla: "bf16-mixed" (autocast on the lazy
// tensors, src/xla/lazy_autocast.h: matrix products and convolutions in bfloat16, softmax,
// norms, reductions and losses in float32, float32 weights) and "bf16-true". Each stays on XLA
// and compiles nothing after warm-up, as in test_zoo.cpp.
//
// Tolerances: bfloat16 keeps 8 significant bits (a rounding moves a value by up to 2^-8 of it),
// and a matrix product's output is rounded to it, so 20 steps end where another order of the same
// roundings ends within a few percent: each loss within 3e-2 relative + 1e-3 absolute of eager's
// run in the same precision (libtorch's CPU autocast and bfloat16 kernels), and within 5e-2 + 1e-2
// of the float32 run.
//
// Each test runs in its own process (CTest), so the backend's counters start at zero and
// XLA_FLAGS, read when the backend starts, can be set by the test.

#include "zoo/check.h"

#include "support.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

using namespace fulgur;
using namespace fulgur::zoo;

namespace {

// The HLO text of every program XLA compiled, as XLA dumped it before its optimizations (the
// emitted StableHLO, one op for one op, in HLO's syntax).
std::string dumped_programs(const std::string& dir) {
  std::string out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.find("before_optimizations.txt") == std::string::npos) continue;
    std::ifstream in(e.path());
    std::stringstream s;
    s << in.rdbuf();
    out += s.str();
  }
  return out;
}

// The number of dot (matrix product) or convolution ops of `kind` in `hlo` whose result is `type`.
int64_t count_ops(const std::string& hlo, const std::string& kind, const std::string& type) {
  const std::regex op("= " + type + R"(\[[0-9,]*\]\S* )" + kind + R"(\()");
  return std::distance(std::sregex_iterator(hlo.begin(), hlo.end(), op), std::sregex_iterator());
}

struct PrecisionRuns {
  Run f32, eager, lazy;
  std::shared_ptr<Recording> lazy_model;
};

// Trains `make()` in float32 on cpu, in `precision` on cpu and in `precision` on xla, from the
// same initial weights; checks that the xla run stays on XLA, compiles nothing after warm-up
// and ends within the stated tolerances.
PrecisionRuns check_precision(const std::function<std::shared_ptr<Recording>()>& make,
                              std::shared_ptr<TensorDataset> data, std::optional<double> clip,
                              const std::string& precision) {
  PrecisionRuns r;
  torch::manual_seed(5);
  auto f32_model = make();
  torch::manual_seed(5);
  auto eager_model = make();
  torch::manual_seed(5);
  r.lazy_model = make();
  r.f32 = train(*f32_model, "cpu", data, clip);
  r.eager = train(*eager_model, "cpu", data, clip, precision);
  const xla::BackendMetrics before = xla::metrics();
  r.lazy = train(*r.lazy_model, "xla", data, clip, precision);
  EXPECT_EQ(left_xla(before, 0), "") << xla::metrics_report();
  EXPECT_EQ(graphs_after_warm_up(*r.lazy_model), 0) << xla::metrics_report();
  const at::Tensor lazy = r.lazy.losses.to(torch::kFloat), eager = r.eager.losses.to(torch::kFloat);
  std::printf("%s: largest loss difference relative to eager %s %.2g, to float32 %.2g\n", precision.c_str(),
              precision.c_str(), ((lazy - eager).abs() / eager.abs()).max().item<double>(),
              ((lazy - r.f32.losses).abs() / r.f32.losses.abs()).max().item<double>());
  EXPECT_TRUE(torch::allclose(lazy, eager, 3e-2, 1e-3)) << "losses: xla\n" << lazy << "\neager " << precision << "\n" << eager;
  EXPECT_TRUE(torch::allclose(lazy, r.f32.losses, 5e-2, 1e-2)) << "losses: xla\n" << lazy << "\nfloat32\n" << r.f32.losses;
  return r;
}

}  // namespace

// The MLP's three linear maps run as bfloat16 dots (forward and backward), its weights stay
// float32, and XLA compiles no float32 dot.
TEST(ZooPrecision, MlpInBf16MixedOnXlaRunsItsMatmulsInBfloat16WithFloat32Weights) {
  fulgur::testing::TempDir dump;
  ASSERT_EQ(setenv("XLA_FLAGS", ("--xla_dump_to=" + dump.path).c_str(), 1), 0);
  const PrecisionRuns r =
      check_precision([] { return std::make_shared<Mlp>(0); }, regression_data(160), 0.5, "bf16-mixed");
  for (const auto& p : r.lazy_model->parameters()) EXPECT_EQ(p.scalar_type(), torch::kFloat);
  const std::string hlo = dumped_programs(dump.path);
  // Forward: one product per layer; backward: the input's gradient (but the first layer's) and
  // the weight's gradient of each.
  EXPECT_GE(count_ops(hlo, "dot", "bf16"), 3 + 5) << hlo;
  EXPECT_EQ(count_ops(hlo, "dot", "f32"), 0) << hlo;
}

// The residual CNN's convolutions in bfloat16 (forward and backward), batch norm and the loss
// in float32.
TEST(ZooPrecision, ResidualCnnInBf16MixedOnXlaRunsItsConvolutionsInBfloat16) {
  fulgur::testing::TempDir dump;
  ASSERT_EQ(setenv("XLA_FLAGS", ("--xla_dump_to=" + dump.path).c_str(), 1), 0);
  check_precision([] { return std::make_shared<ResidualCnn>(0); }, image_data(), std::nullopt, "bf16-mixed");
  const std::string hlo = dumped_programs(dump.path);
  // Two forward convolutions, the second's input gradient, and both weight gradients.
  EXPECT_GE(count_ops(hlo, "convolution", "bf16"), 2 + 3) << hlo;
  EXPECT_EQ(count_ops(hlo, "convolution", "f32"), 0) << hlo;
}

// bfloat16 weights and inputs throughout ("bf16-true").
TEST(ZooPrecision, TransformerInBf16TrueOnXla) {
  const PrecisionRuns r =
      check_precision([] { return std::make_shared<TinyTransformer>(0); }, token_data(), 1.0, "bf16-true");
  for (const auto& p : r.lazy_model->parameters()) EXPECT_EQ(p.scalar_type(), torch::kBFloat16);
}
