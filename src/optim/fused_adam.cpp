#include "optim/fused_adam.h"

#include "runtime/env.h"
#include "runtime/plain_tensor.h"
#include "optim/optim_state.h"

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

template <typename Options, typename State>
bool step(torch::optim::Optimizer& opt, bool adamw) {
  using runtime::is_plain_cpu_float;
  // Check everything first: either the whole step is fused or none of it.
  std::vector<std::string> keys;  // of the parameters with a gradient, in order
  for (auto& group : opt.param_groups()) {
    auto& o = static_cast<Options&>(group.options());
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      if (!is_plain_cpu_float(p) || !is_plain_cpu_float(p.grad()) || p.grad().sizes() != p.sizes()) return false;
      keys.push_back(optimizer_state_key(p));
      auto it = opt.state().find(keys.back());
      if (it == opt.state().end()) continue;
      auto* s = dynamic_cast<State*>(it->second.get());
      if (!s || !is_plain_cpu_float(s->exp_avg()) || !is_plain_cpu_float(s->exp_avg_sq())) return false;
      if (o.amsgrad() && !is_plain_cpu_float(s->max_exp_avg_sq())) return false;
    }
  }
  at::NoGradGuard no_grad;
  size_t next_key = 0;
  for (auto& group : opt.param_groups()) {
    auto& o = static_cast<Options&>(group.options());
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      const std::string& key = keys[next_key++];
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
      const double bias1 = 1 - std::pow(beta1, static_cast<double>(s.step()));
      const double bias2 = 1 - std::pow(beta2, static_cast<double>(s.step()));
      Coefficients c;
      c.beta1 = static_cast<float>(beta1);
      c.one_minus_beta1 = static_cast<float>(1 - beta1);
      c.beta2 = static_cast<float>(beta2);
      c.one_minus_beta2 = static_cast<float>(1 - beta2);
      c.bias2_sqrt = static_cast<float>(std::sqrt(bias2));
      c.eps = static_cast<float>(o.eps());
      c.neg_step_size = static_cast<float>(-(o.lr() / bias1));
      c.amsgrad = o.amsgrad();
      if (o.weight_decay() != 0) {
        if (adamw) {
          c.adamw_decays = true;
          c.adamw_keep = static_cast<float>(1 - o.lr() * o.weight_decay());
        } else {
          c.adam_decays = true;
          c.adam_decay = static_cast<float>(o.weight_decay());
        }
      }
      float* vmax = c.amsgrad ? s.max_exp_avg_sq().template data_ptr<float>() : nullptr;
      update(p.data_ptr<float>(), p.grad().data_ptr<float>(), s.exp_avg().template data_ptr<float>(),
             s.exp_avg_sq().template data_ptr<float>(), vmax, p.numel(), c);
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
