// SPDX-License-Identifier: Apache-2.0
#pragma once
#include <fulgur/strategies/strategy.h>

#include <memory>

namespace fulgur {

// One process, one device (the CPU for the registry's "single_device").
class SingleDeviceStrategy : public Strategy {
 public:
  SingleDeviceStrategy(c10::Device device, std::shared_ptr<Accelerator> accelerator,
                       std::shared_ptr<CheckpointIO> checkpoint_io = nullptr,
                       std::shared_ptr<Precision> precision = nullptr);
  c10::Device root_device() const override { return device_; }

 private:
  c10::Device device_;
};

}  // namespace fulgur
