// SPDX-License-Identifier: Apache-2.0
#pragma once
#include <fulgur/strategies/ddp.h>

#include <memory>
#include <string>
#include <vector>

namespace fulgur {

// Lightning's XLAStrategy: one process per xla device. Gradients are reduced
// at the optimizer step (a StepReducer, not DDP's buckets during backward).
// Checkpoint IO and precision must be the XLA ones (the defaults).
class XLAStrategy : public DDPStrategy {
 public:
  XLAStrategy(std::vector<int64_t> parallel_devices, std::shared_ptr<CheckpointIO> checkpoint_io = nullptr,
              std::shared_ptr<Precision> precision = nullptr, ParallelOptions options = {});
  // Throws before launch: "Accessing the XLA device before processes have spawned is not allowed."
  c10::Device root_device() const override;
  // Marks a step when fit ends, so that nothing is pending when the worker's
  // result is copied to the CPU.
  void on_train_end() override;
  std::shared_ptr<BatchSource> process_dataloader(std::shared_ptr<BatchSource> loader) override;
  void save_checkpoint(const Checkpoint& checkpoint, const std::string& path,
                       const StorageOptions& storage_options = {}) override;
  void teardown() override;
  // With more than one process: marks a step, so that the forward and backward
  // run as a graph of their own and the gradients exist on the device, then
  // reduces them (DDPStrategy::sync_gradients). With one process there is
  // nothing to reduce and no step is marked: on PJRT the forward, backward and
  // update then compile into one graph.
  void sync_gradients() override;

 protected:
  std::unique_ptr<detail::GradientSync> make_gradient_sync() override;
};

}  // namespace fulgur
