// SPDX-License-Identifier: Apache-2.0
#pragma once
// Moving libtorch tensors to and from PJRT buffers.

#include <ATen/core/Tensor.h>

#include "xla/pjrt/client.h"

namespace fulgur::xla::pjrt {

// The PJRT element type of a libtorch dtype; throws std::invalid_argument naming the dtype for
// one PJRT buffers here do not hold (complex, quantized, ...).
ElementType element_type_of(c10::ScalarType dtype);
c10::ScalarType dtype_of(ElementType type);

// Copies `tensor` (any device libtorch can read on the host, any strides) to `client`'s device.
Buffer to_device(const Client& client, const at::Tensor& tensor);

// A new CPU tensor with the contents of `buffer`; waits until they are computed.
at::Tensor to_tensor(const Buffer& buffer);

}  // namespace fulgur::xla::pjrt
