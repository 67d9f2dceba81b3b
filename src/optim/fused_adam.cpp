// SPDX-License-Identifier: Apache-2.0
#include "optim/fused_adam.h"

#include "runtime/env.h"
#include "runtime/plain_tensor.h"
#include "optim/optim_state.h"
#include "xla/lazy_adam.h"

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <typeinfo>
#include <vector>

namespace fulgur::detail {

namespace {

bool enabled() {
  const std::string v = runtime::env_string("FULGUR_FUSED_OPTIMIZER");
  return v != "off" && v != "0";
}

// Per-step constants, as float, the way libtorch's kernels receive the
// double scalars of the tensor ops.
struct Coefficients {
  float beta1, one_minus_beta1, beta2, one_minus_beta2, bias2_sqrt, eps, neg_step_size;
  float adam_decay = 0.0f;       // Adam: grad + decay * p
  float adamw_keep = 1.0f;       // AdamW: p * (1 - lr * decay)
  bool adam_decays = false, adamw_decays = false, amsgrad = false;
};

// One parameter: the body of Adam::step / AdamW::step in libtorch 1.13 for
// one element, in the order of the ops there.
// Built for AVX2 and for the baseline (chosen at load time), and with
// -fno-math-errno (CMakeLists.txt) so that sqrt vectorizes.
// One thread: the pass is memory-bound.
__attribute__((target_clones("avx2", "default"))) void update(float* __restrict p, const float* __restrict g,
                                                               float* __restrict m, float* __restrict v,
                                                               float* __restrict vmax, int64_t n, const Coefficients& c) {
  for (int64_t i = 0; i < n; ++i) {
    float pi = p[i];
    if (c.adamw_decays) pi = pi * c.adamw_keep;  // p.mul_(1 - lr * wd)
    float gi = g[i];
    if (c.adam_decays) gi = gi + c.adam_decay * pi;  // grad.add(p, wd)
    const float mi = m[i] * c.beta1 + c.one_minus_beta1 * gi;              // mul_(b1).add_(g, 1 - b1)
    const float vi = v[i] * c.beta2 + c.one_minus_beta2 * gi * gi;         // mul_(b2).addcmul_(g, g, 1 - b2)
    m[i] = mi;
    v[i] = vi;
    float second = vi;
    if (c.amsgrad) {
      second = vmax[i] > vi ? vmax[i] : vi;  // max_out(max_exp_avg_sq, exp_avg_sq, ...)
      vmax[i] = second;
    }
    const float denom = std::sqrt(second) / c.bias2_sqrt + c.eps;  // (sqrt / sqrt(bc2)).add_(eps)
    p[i] = pi + c.neg_step_size * mi / denom;                        // addcdiv_(m, denom, -step_size)
  }
}

// What every tensor of a step is: all plain CPU float32 (the loop above) or all lazy (one IR
// node per parameter, xla/lazy_adam.h); a mix, or anything else, is not fused.
enum class Path { none, cpu, lazy };

Path path_of(const at::Tensor& p, const at::Tensor& t) {
  using runtime::is_plain_cpu_float;
  if (is_plain_cpu_float(p) && is_plain_cpu_float(t) && t.sizes() == p.sizes()) return Path::cpu;
  if (xla::lazy_adam_takes(p, t)) return Path::lazy;
  return Path::none;
}

Coefficients as_floats(const xla::AdamNumbers& n, bool amsgrad) {
  Coefficients c;
  c.beta1 = static_cast<float>(n.beta1);
  c.one_minus_beta1 = static_cast<float>(n.one_minus_beta1);
  c.beta2 = static_cast<float>(n.beta2);
  c.one_minus_beta2 = static_cast<float>(n.one_minus_beta2);
  c.bias2_sqrt = static_cast<float>(n.bias_correction2_sqrt);
  c.eps = static_cast<float>(n.eps);
  c.neg_step_size = static_cast<float>(n.neg_step_size);
  c.amsgrad = amsgrad;
  c.adamw_decays = n.decay == xla::AdamNumbers::Decay::adamw;
  c.adam_decays = n.decay == xla::AdamNumbers::Decay::adam;
  if (c.adamw_decays) c.adamw_keep = static_cast<float>(n.decay_value);
  if (c.adam_decays) c.adam_decay = static_cast<float>(n.decay_value);
  return c;
}

template <typename Options, typename State>
bool step(torch::optim::Optimizer& opt, bool adamw) {
  // Check everything first: either the whole step is fused or none of it.
  std::vector<void*> keys;  // of the parameters with a gradient, in order
  Path path = Path::none;
  auto same = [&path](Path p) {
    if (p == Path::none || (path != Path::none && p != path)) return false;
    path = p;
    return true;
  };
  for (auto& group : opt.param_groups()) {
    auto& o = static_cast<Options&>(group.options());
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      if (!same(path_of(p, p.grad()))) return false;
      // amsgrad's running maximum is fused on the CPU only.
      if (o.amsgrad() && path == Path::lazy) return false;
      keys.push_back(optimizer_state_key(p));
      auto it = opt.state().find(keys.back());
      if (it == opt.state().end()) continue;
      auto* s = dynamic_cast<State*>(it->second.get());
      if (!s || !same(path_of(p, s->exp_avg())) || !same(path_of(p, s->exp_avg_sq()))) return false;
      if (o.amsgrad() && !same(path_of(p, s->max_exp_avg_sq()))) return false;
    }
  }
  at::NoGradGuard no_grad;
  std::unique_ptr<xla::LazyAdamStep> lazy_step;
  if (path == Path::lazy) lazy_step = std::make_unique<xla::LazyAdamStep>();
  size_t next_key = 0;
  for (auto& group : opt.param_groups()) {
    auto& o = static_cast<Options&>(group.options());
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      void* const key = keys[next_key++];
      auto it = opt.state().find(key);
      if (it == opt.state().end()) {  // as libtorch initializes it
        auto s = std::make_unique<State>();
        s->step(0);
        s->exp_avg(torch::zeros_like(p, at::MemoryFormat::Preserve));
        s->exp_avg_sq(torch::zeros_like(p, at::MemoryFormat::Preserve));
        if (o.amsgrad()) s->max_exp_avg_sq(torch::zeros_like(p, at::MemoryFormat::Preserve));
        opt.state()[key] = std::move(s);
        it = opt.state().find(key);
      }
      auto& s = static_cast<State&>(*it->second);
      s.step(s.step() + 1);
      const double beta1 = std::get<0>(o.betas()), beta2 = std::get<1>(o.betas());
      xla::AdamNumbers n;
      n.beta1 = beta1;
      n.one_minus_beta1 = 1 - beta1;
      n.beta2 = beta2;
      n.one_minus_beta2 = 1 - beta2;
      n.bias_correction2_sqrt = std::sqrt(1 - std::pow(beta2, static_cast<double>(s.step())));
      n.eps = o.eps();
      n.neg_step_size = -(o.lr() / (1 - std::pow(beta1, static_cast<double>(s.step()))));
      if (o.weight_decay() != 0) {
        n.decay = adamw ? xla::AdamNumbers::Decay::adamw : xla::AdamNumbers::Decay::adam;
        n.decay_value = adamw ? 1 - o.lr() * o.weight_decay() : o.weight_decay();
      }
      if (lazy_step) {
        lazy_step->update(p, p.grad(), s.exp_avg(), s.exp_avg_sq(), n);
        continue;
      }
      const Coefficients c = as_floats(n, o.amsgrad());
      // Through a non-template function: `State` is a template parameter, and clang cannot
      // call the data_ptr<T> template of a dependent expression (Tensor has a data_ptr() too).
      auto f32 = [](const at::Tensor& t) { return t.data_ptr<float>(); };
      update(f32(p), f32(p.grad()), f32(s.exp_avg()), f32(s.exp_avg_sq()),
             c.amsgrad ? f32(s.max_exp_avg_sq()) : nullptr, p.numel(), c);
    }
  }
  return true;
}

}  // namespace

bool fused_adam_step(torch::optim::Optimizer& optimizer) {
  return step<torch::optim::AdamOptions, torch::optim::AdamParamState>(optimizer, false);
}

bool fused_adamw_step(torch::optim::Optimizer& optimizer) {
  return step<torch::optim::AdamWOptions, torch::optim::AdamWParamState>(optimizer, true);
}

bool fused_optimizer_step(torch::optim::Optimizer& optimizer) {
  if (!enabled()) return false;
  const OptimizerAdapter* a = optimizer_adapter(optimizer);
  // The exact types only: a subclass may have its own step(), which must run.
  if (!a || !a->fused_step || typeid(optimizer) != a->type) return false;
  return a->fused_step(optimizer);
}

}  // namespace fulgur::detail
