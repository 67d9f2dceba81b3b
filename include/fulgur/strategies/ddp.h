// SPDX-License-Identifier: Apache-2.0
#pragma once
// DDPStrategy: data parallel over processes, with each gradient bucket's
// all-reduce overlapped with backward (PyTorch DDP).

#include <fulgur/strategies/parallel.h>

#include <memory>
#include <vector>

namespace fulgur {
namespace detail {
class GradientSync;
}

class DDPStrategy : public ParallelStrategy {
 public:
  DDPStrategy(std::shared_ptr<Accelerator> accelerator, std::vector<int64_t> parallel_devices,
              std::shared_ptr<CheckpointIO> checkpoint_io = nullptr, std::shared_ptr<Precision> precision = nullptr,
              ParallelOptions options = {});
  ~DDPStrategy() override;
  void setup(Trainer& trainer) override;
  void teardown() override;
  void sync_gradients() override;
  void set_gradient_sync(bool enabled) override;
  // Wall time this rank spent in gradient sync during fit so far (seconds;
  // 0 on one process). On xla devices the step mark that materializes the
  // gradients is not counted.
  double gradient_sync_seconds() const;

 protected:
  // The gradient sync component: DDP overlaps bucketed all-reduces with backward.
  virtual std::unique_ptr<detail::GradientSync> make_gradient_sync();
  std::unique_ptr<detail::GradientSync> gradient_sync_;
};

}  // namespace fulgur
