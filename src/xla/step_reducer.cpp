// SPDX-License-Identifier: Apache-2.0
#include "xla/step_reducer.h"

#include <fulgur/xla/backend.h>

#include <torch/torch.h>

namespace fulgur::detail {
namespace {

class StepReducer : public GradientSync {
 public:
  StepReducer(std::vector<at::Tensor> params, std::shared_ptr<Collectives> c, int64_t max_bytes, DDPCommHook hook)
      : params_(std::move(params)), collectives_(std::move(c)) {
    buckets_ = make_buckets(params_, max_bytes, max_bytes);
    apply_comm_hook(buckets_, hook);
  }

  void finalize() override {
    if (!enabled_ || params_.empty()) return;
    ScopedTimer timer(seconds_);
    torch::NoGradGuard no_grad;
    // Fill every buffer, start all reductions, then write back.
    for (auto& b : buckets_) {
      for (size_t j = 0; j < b.params.size(); ++j) {
        const auto& p = params_[b.params[j]];
        auto slice = b.flat.narrow(0, b.offsets[j], p.numel());
        if (!p.grad().defined()) {
          slice.zero_();
        } else if (p.grad().device().type() == c10::kLazy) {
          xla::backend().copy_to_host(p.grad(), slice);
        } else {
          slice.copy_(p.grad().to(torch::kCPU).reshape({-1}));
        }
      }
      start_all_reduce(b, *collectives_);
    }
    const double inv = 1.0 / static_cast<double>(collectives_->world_size());
    for (auto& b : buckets_) {
      finish_all_reduce(b);
      b.flat.mul_(inv);
      for (size_t j = 0; j < b.params.size(); ++j) {
        at::Tensor& p = params_[b.params[j]];
        write_back(p, b.flat.narrow(0, b.offsets[j], p.numel()));
      }
    }
  }

 private:
  static void write_back(at::Tensor& p, const at::Tensor& flat_slice) {
    const at::Tensor slice = flat_slice.view(p.sizes());
    if (p.device().type() == c10::kLazy) {
      p.mutable_grad() = xla::backend().from_host(slice, p.device());
    } else if (p.grad().defined()) {
      // CPU and CUDA: into the gradient in place (on CUDA one host-to-device copy).
      p.mutable_grad().copy_(slice);
    } else {
      p.mutable_grad() = slice.to(p.device(), /*non_blocking=*/false, /*copy=*/true);
    }
  }

  std::vector<at::Tensor> params_;
  std::shared_ptr<Collectives> collectives_;
  std::vector<Bucket> buckets_;
};

}  // namespace

std::unique_ptr<GradientSync> make_step_reducer(std::vector<at::Tensor> params, std::shared_ptr<Collectives> c,
                                                int64_t max_bytes, DDPCommHook hook) {
  return std::make_unique<StepReducer>(std::move(params), std::move(c), max_bytes, hook);
}

}  // namespace fulgur::detail
