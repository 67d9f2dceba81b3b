// SPDX-License-Identifier: Apache-2.0
#pragma once
// What the one-device and the multi-process XLA strategies share.

#include <fulgur/data/data_loader.h>
#include <fulgur/plugins/io/checkpoint_io.h>
#include <fulgur/plugins/precision/xla.h>

#include <c10/core/Device.h>

#include <memory>

namespace fulgur::detail {

// The XLA CheckpointIO / precision plugin: a default one for nullptr, the
// given one if it is an XLA one; anything else throws std::invalid_argument
// naming `who`.
std::shared_ptr<CheckpointIO> xla_checkpoint_io(std::shared_ptr<CheckpointIO> io, const char* who);
std::shared_ptr<Precision> xla_precision(std::shared_ptr<Precision> precision, const char* who);

// `loader` as a DeviceLoader that records each batch's shapes for the
// recompile warning and marks a step before handing it out. A loader that is
// already a DeviceLoader comes back unchanged.
std::shared_ptr<BatchSource> xla_device_loader(std::shared_ptr<BatchSource> loader, const c10::Device& device);

}  // namespace fulgur::detail
