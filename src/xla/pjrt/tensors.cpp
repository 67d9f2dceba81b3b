// SPDX-License-Identifier: Apache-2.0
#include "xla/pjrt/tensors.h"

#include <ATen/ATen.h>

#include <stdexcept>
#include <string>

namespace fulgur::xla::pjrt {

ElementType element_type_of(c10::ScalarType dtype) {
  switch (dtype) {
    case c10::kBool: return ElementType::pred;
    case c10::kChar: return ElementType::s8;
    case c10::kShort: return ElementType::s16;
    case c10::kInt: return ElementType::s32;
    case c10::kLong: return ElementType::s64;
    case c10::kByte: return ElementType::u8;
    case c10::kHalf: return ElementType::f16;
    case c10::kFloat: return ElementType::f32;
    case c10::kDouble: return ElementType::f64;
    case c10::kBFloat16: return ElementType::bf16;
    default:
      throw std::invalid_argument(std::string("PJRT buffers here hold no ") + c10::toString(dtype) +
                                  " tensors; allowed: bool, int8, int16, int32, int64, uint8, float16, "
                                  "float32, float64, bfloat16");
  }
}

c10::ScalarType dtype_of(ElementType type) {
  switch (type) {
    case ElementType::pred: return c10::kBool;
    case ElementType::s8: return c10::kChar;
    case ElementType::s16: return c10::kShort;
    case ElementType::s32: return c10::kInt;
    case ElementType::s64: return c10::kLong;
    case ElementType::u8: return c10::kByte;
    case ElementType::f16: return c10::kHalf;
    case ElementType::f32: return c10::kFloat;
    case ElementType::f64: return c10::kDouble;
    case ElementType::bf16: return c10::kBFloat16;
  }
  throw std::invalid_argument("PJRT buffer type " + std::to_string(static_cast<int>(type)) +
                              " has no libtorch dtype here");
}

Buffer to_device(const Client& client, const at::Tensor& tensor) {
  const at::Tensor host = tensor.to(c10::kCPU).contiguous();
  const auto sizes = host.sizes();
  return client.to_device(host.data_ptr(), element_type_of(host.scalar_type()),
                          std::vector<int64_t>(sizes.begin(), sizes.end()));
}

at::Tensor to_tensor(const Buffer& buffer) {
  at::Tensor out = at::empty(buffer.dims(), at::TensorOptions().dtype(dtype_of(buffer.element_type())));
  buffer.to_host(out.data_ptr(), out.nbytes());
  return out;
}

}  // namespace fulgur::xla::pjrt
