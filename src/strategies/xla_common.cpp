// SPDX-License-Identifier: Apache-2.0
#include "strategies/xla_common.h"

#include <fulgur/data/device_loader.h>

#include <fulgur/xla/backend.h>

#include <stdexcept>
#include <string>

namespace fulgur::detail {

std::shared_ptr<CheckpointIO> xla_checkpoint_io(std::shared_ptr<CheckpointIO> io, const char* who) {
  if (!io) return std::make_shared<XLACheckpointIO>();
  if (!dynamic_cast<XLACheckpointIO*>(io.get())) {
    throw std::invalid_argument(std::string(who) + ": checkpoint_io must be an XLACheckpointIO (tensors must leave the "
                                "xla device before writing); got another CheckpointIO");
  }
  return io;
}

std::shared_ptr<Precision> xla_precision(std::shared_ptr<Precision> precision, const char* who) {
  if (!precision) return std::make_shared<XLAPrecision>();
  if (!dynamic_cast<XLAPrecision*>(precision.get())) {
    throw std::invalid_argument(std::string(who) + ": precision plugin must be an XLAPrecision, got a plain Precision ('" +
                                precision->name() + "')");
  }
  if (precision->autocast_dtype() && *precision->autocast_dtype() != c10::kBFloat16) {
    throw std::invalid_argument(std::string(who) + ": precision '" + precision->name() +
                                "' is float16 autocast, which runs on CUDA devices; valid on xla: \"32-true\", "
                                "\"bf16-mixed\", \"bf16-true\" (or use accelerator \"cuda\")");
  }
  return precision;
}

std::shared_ptr<BatchSource> xla_device_loader(std::shared_ptr<BatchSource> loader, const c10::Device& device) {
  if (std::dynamic_pointer_cast<DeviceLoader>(loader)) return loader;
  return std::make_shared<DeviceLoader>(std::move(loader), device, [](const Batch& b) {
    xla::note_inputs({b.data, b.target});
    xla::mark_step();
  });
}

}  // namespace fulgur::detail
