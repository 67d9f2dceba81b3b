// SPDX-License-Identifier: Apache-2.0
// libFuzzer target: the bytes another rank sends with broadcast_object, as
// the receivers decode them. Any input must decode or throw
// SerializationError; a crash, a sanitizer report, another exception type or
// an allocation larger than the input is a bug.

#include "serialize/torch_archive.h"

#include <cstddef>
#include <cstdint>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    fulgur::detail::load_torch_archive(data, size, "the broadcast_object payload of rank 1");
  } catch (const fulgur::SerializationError&) {
  }
  return 0;
}
