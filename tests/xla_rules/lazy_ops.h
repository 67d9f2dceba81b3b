// SPDX-License-Identifier: Apache-2.0
#pragma once
// What the per-op tests on the lazy device share (tests/xla_rules/test_<family>.cpp, the XlaOps
// suite): each op, and what autograd traces for its backward, runs on eager CPU tensors and on
// xla tensors (the pjrt backend, the real CPU plugin), in the graphs libtorch's lazy core makes.
// Results and gradients must agree with eager libtorch's, and nothing may leave XLA: no graph
// kept on TorchScript (xla_fallbacks) and no op run eagerly on the host (eager_fallbacks),
// except where a test names an op the lazy core itself has no node for.
//
// Tolerances: float32 1e-5 relative + 1e-6 absolute (XLA's transcendental functions are not
// Sleef's; sums in another order); bfloat16 1e-2 relative + 1e-2 absolute (one rounding, 2^-8
// relative, where libtorch rounds an intermediate XLA keeps in float32). NaN where libtorch has
// NaN. Bool and integer results exactly.
//
// Each test runs in its own process (CTest), so the backend's counters start at zero.

#include "support.h"

#include "runtime/log.h"
#include "xla/stablehlo/lowering.h"
#include "xla/threefry.h"

#include <fulgur/module_mover.h>
#include <fulgur/xla/backend.h>
#include <fulgur/xla/random.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "xla_rules/tolerance.h"

namespace xla_rules {

using namespace fulgur;


inline constexpr double kInf = std::numeric_limits<double>::infinity();
inline constexpr double kNan = std::numeric_limits<double>::quiet_NaN();

inline const Tolerance kBf16{1e-2, 1e-2};

using Fn = std::function<torch::Tensor(const std::vector<torch::Tensor>&)>;

inline void expect_close(const torch::Tensor& got, const torch::Tensor& want, const Tolerance& tol, const std::string& what) {
  ASSERT_EQ(got.scalar_type(), want.scalar_type()) << what;
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  if (want.is_floating_point()) {
    EXPECT_TRUE(torch::allclose(got.to(torch::kDouble), want.to(torch::kDouble), tol.rtol, tol.atol, true))
        << what << ": largest difference " << (got.to(torch::kDouble) - want.to(torch::kDouble)).abs().nan_to_num(0).max().item<double>()
        << (want.numel() <= 64 ? "\ngot\n" + c10::str(got) + "\nwant\n" + c10::str(want) : "");
  } else {
    EXPECT_TRUE(torch::equal(got, want)) << what << "\ngot\n" << got << "\nwant\n" << want;
  }
}

// The ops that left XLA since `before`: graphs kept on TorchScript by op, ops run eagerly.
inline std::string new_fallbacks(const xla::BackendMetrics& before, const std::set<std::string>& allowed_eager) {
  const xla::BackendMetrics after = xla::metrics();
  std::string out;
  for (const auto& [op, count] : after.xla_fallbacks)
    if (!before.xla_fallbacks.count(op) || before.xla_fallbacks.at(op) != count) out += " on TorchScript: " + op;
  for (const auto& [op, count] : after.eager_fallbacks)
    if ((!before.eager_fallbacks.count(op) || before.eager_fallbacks.at(op) != count) && !allowed_eager.count(op))
      out += " eager: " + op;
  return out;
}

struct Options {
  Tolerance tol;
  // Whether the floating inputs require gradients: the output's backward (with an upstream
  // gradient of random values) runs too, and the gradients are compared.
  bool backward = true;
  // Ops the lazy core runs eagerly because it has no node for them (named by the test).
  std::set<std::string> allowed_eager;
  // With backward: how many leading floating inputs require gradients (the others are data,
  // such as a loss's target).
  size_t grad_inputs = SIZE_MAX;
};

// Runs `f` on `inputs` on the CPU and on xla copies of them, and compares the results (and the
// inputs' gradients) after a step mark; fails if anything left XLA.
inline void check_op(const std::string& label, const Fn& f, const std::vector<torch::Tensor>& inputs, const Options& o = {}) {
  SCOPED_TRACE(label);
  const c10::Device dev = xla::backend().device();
  std::vector<torch::Tensor> cpu, lazy;
  for (const auto& t : inputs) {
    const bool grad = o.backward && t.is_floating_point() && cpu.size() < o.grad_inputs;
    cpu.push_back(t.clone().requires_grad_(grad));
    lazy.push_back(t.to(dev).detach().requires_grad_(grad));
  }
  const torch::Tensor want = f(cpu);
  torch::Tensor upstream;
  if (o.backward) {
    upstream = torch::randn(want.sizes()).to(want.scalar_type());
    want.backward(upstream);
  }
  const xla::BackendMetrics before = xla::metrics();
  const torch::Tensor got_lazy = f(lazy);
  if (o.backward) got_lazy.backward(upstream.to(dev));
  xla::mark_step();
  expect_close(got_lazy.detach().cpu(), want.detach(), o.tol, label + ": result");
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!cpu[i].requires_grad()) continue;
    ASSERT_TRUE(lazy[i].grad().defined()) << label << ": no gradient of input " << i;
    expect_close(lazy[i].grad().cpu(), cpu[i].grad(), o.tol, label + ": gradient of input " + std::to_string(i));
  }
  EXPECT_EQ(new_fallbacks(before, o.allowed_eager), "") << xla::metrics_report();
  EXPECT_GT(xla::metrics().xla_executions, before.xla_executions) << "nothing ran on XLA";
}

inline Options bf16_options(Options o = {}) {
  o.tol = kBf16;
  return o;
}

// Values with the edges an elementwise op must get right: zeros of both signs, ±inf, NaN, ties.
inline torch::Tensor edges(torch::Dtype dtype = torch::kFloat) {
  return torch::tensor({0.0, -0.0, 1.0, -1.0, 0.5, 3.0, -20.0, 20.0, kInf, -kInf, kNan, 1.0}, torch::kDouble).to(dtype);
}

// The ops that ran eagerly since `before`, with their counts.
inline std::map<std::string, int64_t> new_eager_ops(const xla::BackendMetrics& before) {
  std::map<std::string, int64_t> out;
  for (const auto& [op, count] : xla::metrics().eager_fallbacks) {
    const int64_t added = count - (before.eager_fallbacks.count(op) ? before.eager_fallbacks.at(op) : 0);
    if (added > 0) out[op] = added;
  }
  return out;
}

using Loss = std::function<torch::Tensor(torch::nn::Module& model, const torch::Tensor& x)>;

// Trains two copies of `make()` (made from seed 0: one on the CPU, one on xla) for `steps` steps
// of SGD with momentum on `loss`, a step mark after each xla step, and checks that each xla loss
// is the CPU's within `tol` and that no graph stayed on TorchScript. Returns the ops that ran
// eagerly during the xla steps (the caller says which it allows).
inline std::map<std::string, int64_t> check_training(const std::string& label,
                                                     const std::function<std::shared_ptr<torch::nn::Module>()>& make,
                                                     const Loss& loss, const torch::Tensor& x, int steps = 4,
                                                     const Tolerance& tol = {1e-4, 1e-5}) {
  SCOPED_TRACE(label);
  const c10::Device dev = xla::backend().device();
  torch::manual_seed(0);
  const auto cpu = make();
  torch::manual_seed(0);
  const auto lazy = make();
  move_module(*lazy, dev);  // fulgur's: Module::to cannot give a CPU parameter a lazy tensor
  torch::optim::SGD cpu_opt(cpu->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  torch::optim::SGD lazy_opt(lazy->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  const torch::Tensor lazy_x = x.to(dev);
  const xla::BackendMetrics before = xla::metrics();
  for (int step = 0; step < steps; ++step) {
    cpu_opt.zero_grad();
    const torch::Tensor want = loss(*cpu, x);
    want.backward();
    cpu_opt.step();
    lazy_opt.zero_grad();
    const torch::Tensor got = loss(*lazy, lazy_x);
    got.backward();
    lazy_opt.step();
    xla::mark_step();
    expect_close(got.detach().cpu(), want.detach(), tol, label + ": loss of step " + std::to_string(step));
  }
  const std::map<std::string, int64_t> eager = new_eager_ops(before);
  EXPECT_TRUE(xla::metrics().xla_fallbacks == before.xla_fallbacks) << xla::metrics_report();
  EXPECT_GT(xla::metrics().xla_executions, before.xla_executions) << "nothing ran on XLA";
  return eager;
}

}  // namespace xla_rules
