// SPDX-License-Identifier: Apache-2.0
// libFuzzer target: a state_dict saved by Python's torch.save, loaded into a
// module (fulgur::load_from_checkpoint's path, from bytes). Any input must
// load or throw a std::exception; a crash, a sanitizer report or an
// allocation larger than the input is a bug.

#include "serialize/torch_archive.h"

#include <fulgur/checkpoint.h>

#include <torch/torch.h>

#include <cstddef>
#include <cstdint>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static torch::nn::Linear model(3, 2);
  try {
    const c10::IValue v = fulgur::detail::load_torch_archive(data, size, "fuzz input");
    const auto sd = fulgur::detail::as_str_dict(v, "fuzz input");
    fulgur::load_state_dict(*model, sd, true, "fuzz input");
  } catch (const std::exception&) {
  }
  return 0;
}
