// SPDX-License-Identifier: Apache-2.0
// libFuzzer target: the IDX reader (MNIST's files) on arbitrary bytes. Any
// input must give a tensor or a std::runtime_error; a crash, a sanitizer
// report, or an allocation larger than the input is a bug.

#include "data/idx.h"

#include <cstddef>
#include <cstdint>
#include <stdexcept>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // MNIST's two kinds (images: 3 dimensions, labels: 1), and the kind the
  // input's own magic number names.
  int dims[3] = {3, 1, size >= 4 ? data[3] % 9 : 2};
  for (int d : dims) {
    try {
      fulgur::detail::decode_idx("fuzz input", data, size, 0x800u + static_cast<uint32_t>(d), d);
    } catch (const std::runtime_error&) {
    }
  }
  return 0;
}
