// SPDX-License-Identifier: Apache-2.0
#pragma once
// Bounds on what a reader of untrusted bytes builds. The defaults are far
// above any real checkpoint (a 7B-parameter model's checkpoint has about 300
// records, nesting 6 deep and under 100k pickle values) and far below what
// would exhaust this machine; a limit that is hit is named in the error.

#include <fulgur/serialization_error.h>

#include <cstdint>

namespace fulgur::detail {

struct ReadLimits {
  // Records in one zip archive.
  uint64_t max_records = 1u << 20;
  // Values (containers, strings, numbers, tensors) one pickle may create.
  uint64_t max_values = 10'000'000;
  // Containers inside containers.
  int max_depth = 512;
  // Dimensions of one tensor.
  int max_tensor_dims = 64;
};

}  // namespace fulgur::detail
