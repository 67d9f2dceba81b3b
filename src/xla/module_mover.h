#pragma once
// Moving a module's parameters and buffers to a device.

#include <c10/core/Device.h>
#include <torch/nn/module.h>

namespace fulgur {

// Moves every parameter and buffer of `module` (recursively) to `device`,
// keeping the identity of tensors shared between submodules (tied weights
// stay tied). Works for lazy devices, where torch::nn::Module::to cannot.
void move_module(torch::nn::Module& module, const c10::Device& device);

}  // namespace fulgur
