// SPDX-License-Identifier: Apache-2.0
#pragma once
// Gradient sync: after backward, every rank's gradients become the mean over
// ranks. Two components with one interface:
//  - BucketReducer (DDPStrategy): gradients are copied into flat buckets as
//    autograd produces them; a bucket's all-reduce starts as soon as it is
//    full, while backward continues (PyTorch DDP's overlap).
//  - StepReducer (XLAStrategy; src/xla/step_reducer.h): at the optimizer
//    step, all gradients are flattened into as few buffers as possible and
//    reduced together (torch_xla's reduce_gradients).

#include <fulgur/distributed/collectives.h>
#include <fulgur/strategies/ddp_comm_hook.h>

#include <torch/nn/module.h>

#include <chrono>
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
  DDPCommHook comm_hook = DDPCommHook::kNone;
};

// Adds the lifetime of this object to `total` (seconds).
class ScopedTimer {
 public:
  explicit ScopedTimer(double& total) : total_(total), start_(std::chrono::steady_clock::now()) {}
  ~ScopedTimer() { total_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count(); }
  ScopedTimer(const ScopedTimer&) = delete;
  ScopedTimer& operator=(const ScopedTimer&) = delete;

 private:
  double& total_;
  std::chrono::steady_clock::time_point start_;
};

// A flat CPU buffer and the parameters whose gradients it holds.
struct Bucket {
  at::Tensor flat;
  std::vector<size_t> params;   // indices into the reducer's parameter list
  std::vector<int64_t> offsets;  // element offset of each parameter in `flat`
  size_t ready = 0;
  std::unique_ptr<PendingReduce> pending;
  // What is all-reduced instead of `flat` under a compressing comm hook (a
  // bfloat16 buffer of flat's size); undefined: `flat` itself.
  at::Tensor wire;
};

// Buckets of one dtype each, filled in reverse parameter order (the order in which backward
// produces gradients), the first one at most `first_bytes` so communication starts early.
std::vector<Bucket> make_buckets(const std::vector<at::Tensor>& params, int64_t first_bytes, int64_t bytes);

// Under kBf16Compress: gives every float32 and float64 bucket its bfloat16 wire buffer.
void apply_comm_hook(std::vector<Bucket>& buckets, DDPCommHook hook);
// Starts the sum over ranks of b.flat (through b.wire when it has one): the
// same calls on every rank, in the same bucket order.
void start_all_reduce(Bucket& b, Collectives& collectives);
// Waits for start_all_reduce's sum; b.flat then holds it, in flat's dtype.
void finish_all_reduce(Bucket& b);

// The parameters that need gradients, each once (tied weights appear once).
std::vector<at::Tensor> unique_trainable_parameters(const torch::nn::Module& module);

std::unique_ptr<GradientSync> make_bucket_reducer(std::vector<at::Tensor> params, std::shared_ptr<Collectives> collectives,
                                                  BucketOptions options = {});

}  // namespace fulgur::detail
