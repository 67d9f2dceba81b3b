// SPDX-License-Identifier: Apache-2.0
#include <fulgur/accelerators/accelerator.h>
#include <fulgur/lightning_module.h>
#include <fulgur/strategies/xla.h>

#include "strategies/xla_common.h"
#include "xla/step_reducer.h"
#include <fulgur/xla/backend.h>

#include <iostream>
#include <stdexcept>

namespace fulgur {

XLAStrategy::XLAStrategy(std::vector<int64_t> parallel_devices, std::shared_ptr<CheckpointIO> checkpoint_io,
                         std::shared_ptr<Precision> precision, ParallelOptions options)
    : DDPStrategy(std::make_shared<XLAAccelerator>(), std::move(parallel_devices),
                  detail::xla_checkpoint_io(std::move(checkpoint_io), "XLAStrategy"),
                  detail::xla_precision(std::move(precision), "XLAStrategy"), std::move(options)) {}

c10::Device XLAStrategy::root_device() const {
  if (!launched_) throw std::runtime_error("Accessing the XLA device before processes have spawned is not allowed.");
  return accelerator_->device(local_rank());
}

void XLAStrategy::on_train_end() { xla::mark_step(); }

std::unique_ptr<detail::GradientSync> XLAStrategy::make_gradient_sync() {
  // sync_gradients marks the step (materializing the gradients) before the reduction.
  return detail::make_step_reducer(detail::unique_trainable_parameters(*model_), collectives_, 64 << 20,
                                   options_.ddp_comm_hook());
}

void XLAStrategy::sync_gradients() {
  if (world_size() == 1) return;
  xla::mark_step();
  DDPStrategy::sync_gradients();
}

std::shared_ptr<BatchSource> XLAStrategy::process_dataloader(std::shared_ptr<BatchSource> loader) {
  // A DeviceLoader that process_dataloader made comes back unchanged from both steps.
  return detail::xla_device_loader(ParallelStrategy::process_dataloader(std::move(loader)), root_device());
}

void XLAStrategy::save_checkpoint(const Checkpoint& checkpoint, const std::string& path,
                                  const StorageOptions& storage_options) {
  xla::mark_step();
  ParallelStrategy::save_checkpoint(checkpoint, path, storage_options);
}

void XLAStrategy::teardown() {
  if (launched_) xla::mark_step();
  if (options_.debug() && is_global_zero()) std::cerr << xla::metrics_report() << std::endl;
  DDPStrategy::teardown();
}

}  // namespace fulgur
