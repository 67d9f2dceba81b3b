// SPDX-License-Identifier: Apache-2.0
#include <fulgur/accelerators/accelerator.h>
#include <fulgur/lightning_module.h>
#include <fulgur/strategies/single_xla.h>

#include "strategies/xla_common.h"
#include <fulgur/xla/backend.h>

namespace fulgur {

SingleDeviceXLAStrategy::SingleDeviceXLAStrategy(std::shared_ptr<CheckpointIO> checkpoint_io,
                                                 std::shared_ptr<Precision> precision)
    : SingleDeviceStrategy(c10::Device(c10::kCPU), std::make_shared<XLAAccelerator>(),
                           detail::xla_checkpoint_io(std::move(checkpoint_io), "SingleDeviceXLAStrategy"),
                           detail::xla_precision(std::move(precision), "SingleDeviceXLAStrategy")) {}

c10::Device SingleDeviceXLAStrategy::root_device() const { return xla::backend().device(); }

void SingleDeviceXLAStrategy::on_train_end() { xla::mark_step(); }

void SingleDeviceXLAStrategy::save_checkpoint(const Checkpoint& checkpoint, const std::string& path,
                                              const StorageOptions& storage_options) {
  xla::mark_step();
  Strategy::save_checkpoint(checkpoint, path, storage_options);
}

std::shared_ptr<BatchSource> SingleDeviceXLAStrategy::process_dataloader(std::shared_ptr<BatchSource> loader) {
  return detail::xla_device_loader(std::move(loader), root_device());
}

void SingleDeviceXLAStrategy::teardown() {
  xla::mark_step();
  Strategy::teardown();
}

}  // namespace fulgur
