// SPDX-License-Identifier: Apache-2.0
#pragma once
// The tensors that fulgur's hand-written loops (the fused optimizer step, the
// gradient buckets' copies) may read through a float pointer.

#include <ATen/core/Tensor.h>

namespace fulgur::runtime {

// Defined, dense (strided), contiguous, float32, on the CPU.
inline bool is_plain_cpu_float(const at::Tensor& t) {
  return t.defined() && t.device().is_cpu() && t.scalar_type() == at::kFloat && t.layout() == at::kStrided &&
         t.is_contiguous();
}

}  // namespace fulgur::runtime
