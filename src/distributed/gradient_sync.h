// SPDX-License-Identifier: Apache-2.0
#pragma once
// Gradient sync: after backward, every rank's gradients become the mean over
// ranks. Two components with one interface:
//  - BucketReducer (DDPStrategy): gradients are copied into flat buckets as
//    autograd produces them; a bucket's all-reduce starts as soon as it is
//    full, while backward continues (PyTorch DDP's overlap).
//  - StepReducer (XLAStrategy): at the optimizer step, all gradients are
//    flattened into as few buffers as possible and reduced together
//    (torch_xla's reduce_gradients). On lazy devices the gradients must be
//    materialized before finalize() (XLAStrategy marks the step first). On
//    the pjrt xla backend each gradient is copied once from its PJRT buffer
//    into the flat buffer and once from there into a new PJRT buffer.

#include <fulgur/distributed/collectives.h>

#include <torch/nn/module.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace fulgur::detail {

class GradientSync {
 public:
  virtual ~GradientSync() = default;
  // Makes p.grad() the mean over ranks for every parameter. Blocks.
  virtual void finalize() = 0;
  // false: the next backward passes accumulate locally (gradient accumulation).
  virtual void set_enabled(bool enabled) { enabled_ = enabled; }
  // Wall time spent in this component so far (copies into buckets during
  // backward, waiting for the reductions, writing gradients back), seconds.
  double seconds() const { return seconds_; }

 protected:
  bool enabled_ = true;
  double seconds_ = 0.0;
};

struct BucketOptions {
  int64_t first_bucket_bytes = 1 << 20;
  int64_t bucket_bytes = 25 << 20;
};

// The parameters that need gradients, each once (tied weights appear once).
std::vector<at::Tensor> unique_trainable_parameters(const torch::nn::Module& module);

std::unique_ptr<GradientSync> make_bucket_reducer(std::vector<at::Tensor> params, std::shared_ptr<Collectives> collectives,
                                                  BucketOptions options = {});
std::unique_ptr<GradientSync> make_step_reducer(std::vector<at::Tensor> params, std::shared_ptr<Collectives> collectives,
                                                int64_t max_buffer_bytes = 64 << 20);

}  // namespace fulgur::detail
