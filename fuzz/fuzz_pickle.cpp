// SPDX-License-Identifier: Apache-2.0
// libFuzzer target: the restricted unpickler on its own. The input is the
// pickle (data.pkl) of an otherwise well-formed archive that also holds
// storages '0' to '3' (16, 0, 64 and 7 bytes), so that mutations reach the
// unpickler and the tensor checks instead of breaking the zip. Any input must
// load or throw SerializationError; anything else is a bug.

#include "serialize/torch_archive.h"
#include "stored_zip.h"

#include <cstddef>
#include <cstdint>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes = fulgur::testing::stored_zip({
      {"archive/data.pkl", std::string(reinterpret_cast<const char*>(data), size)},
      {"archive/data/0", std::string(16, '\1')},
      {"archive/data/1", std::string()},
      {"archive/data/2", std::string(64, '\2')},
      {"archive/data/3", std::string(7, '\3')},
  });
  try {
    fulgur::detail::load_torch_archive(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "fuzz input");
  } catch (const fulgur::SerializationError&) {
  }
  return 0;
}
