// SPDX-License-Identifier: Apache-2.0
#include <fulgur/accelerators/accelerator.h>
#include <fulgur/lightning_module.h>
#include <fulgur/plugins/precision/precision.h>
#include <fulgur/strategies/single_device.h>

namespace fulgur {

SingleDeviceStrategy::SingleDeviceStrategy(c10::Device device, std::shared_ptr<Accelerator> accelerator,
                                           std::shared_ptr<CheckpointIO> checkpoint_io,
                                           std::shared_ptr<Precision> precision)
    : Strategy(std::move(accelerator), std::move(checkpoint_io), std::move(precision)), device_(device) {}

}  // namespace fulgur
