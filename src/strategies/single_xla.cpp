#include <fulgur/data/device_loader.h>
#include <fulgur/strategies/strategy.h>

#include "xla/backend.h"

#include <torch/torch.h>

#include <stdexcept>

namespace fulgur {
namespace {

void require_xla_plugins(const std::shared_ptr<CheckpointIO>& io, const std::shared_ptr<Precision>& precision,
                         const char* who) {
  if (io && !dynamic_cast<XLACheckpointIO*>(io.get())) {
    throw std::invalid_argument(std::string(who) + ": checkpoint_io must be an XLACheckpointIO (tensors must leave the "
                                "xla device before writing); got another CheckpointIO");
  }
  if (precision && !dynamic_cast<XLAPrecision*>(precision.get())) {
    throw std::invalid_argument(std::string(who) + ": precision plugin must be an XLAPrecision, got a plain Precision ('" +
                                precision->name() + "')");
  }
}

}  // namespace

SingleDeviceXLAStrategy::SingleDeviceXLAStrategy(std::shared_ptr<CheckpointIO> checkpoint_io,
                                                 std::shared_ptr<Precision> precision)
    : SingleDeviceStrategy(c10::Device(c10::kCPU), std::make_shared<XLAAccelerator>(), std::move(checkpoint_io),
                           std::move(precision)) {
  require_xla_plugins(checkpoint_io_, precision_, "SingleDeviceXLAStrategy");
  if (!checkpoint_io_) checkpoint_io_ = std::make_shared<XLACheckpointIO>();
  if (!precision_) precision_ = std::make_shared<XLAPrecision>();
}

c10::Device SingleDeviceXLAStrategy::root_device() const { return xla::backend().device(); }

void SingleDeviceXLAStrategy::optimizer_step(torch::optim::Optimizer& optimizer, const std::function<void()>& closure,
                                             const std::function<void()>& before_step) {
  Strategy::optimizer_step(optimizer, closure, before_step);
}

void SingleDeviceXLAStrategy::mark_step() { xla::mark_step(); }

void SingleDeviceXLAStrategy::save_checkpoint(const Checkpoint& checkpoint, const std::string& path,
                                              const StorageOptions& storage_options) {
  mark_step();
  Strategy::save_checkpoint(checkpoint, path, storage_options);
}

std::shared_ptr<BatchSource> SingleDeviceXLAStrategy::process_dataloader(std::shared_ptr<BatchSource> loader) {
  if (std::dynamic_pointer_cast<DeviceLoader>(loader)) return loader;
  return std::make_shared<DeviceLoader>(loader, root_device(), [](const Batch& b) {
    xla::note_inputs({b.data, b.target});
    xla::mark_step();
  });
}

void SingleDeviceXLAStrategy::teardown() {
  mark_step();
  Strategy::teardown();
}

}  // namespace fulgur
