// SPDX-License-Identifier: Apache-2.0
#pragma once
#include <fulgur/strategies/single_device.h>

#include <memory>
#include <string>

namespace fulgur {

// One process on one xla device: steps are marked; checkpoints are written
// from the CPU.
class SingleDeviceXLAStrategy : public SingleDeviceStrategy {
 public:
  explicit SingleDeviceXLAStrategy(std::shared_ptr<CheckpointIO> checkpoint_io = nullptr,
                                   std::shared_ptr<Precision> precision = nullptr);
  c10::Device root_device() const override;
  // Marks a step when fit ends, so that nothing is pending when the worker's
  // result is copied to the CPU.
  void on_train_end() override;
  void save_checkpoint(const Checkpoint& checkpoint, const std::string& path,
                       const StorageOptions& storage_options = {}) override;
  std::shared_ptr<BatchSource> process_dataloader(std::shared_ptr<BatchSource> loader) override;
  void teardown() override;
};

}  // namespace fulgur
