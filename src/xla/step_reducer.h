// SPDX-License-Identifier: Apache-2.0
#pragma once
// XLAStrategy's gradient sync (torch_xla's reduce_gradients): at the optimizer step every
// gradient is flattened into as few CPU buffers as possible (one dtype each, at most
// max_buffer_bytes), all are all-reduced together, and each mean goes back as the parameter's
// gradient. On lazy devices the gradients must be materialized before finalize() (XLAStrategy
// marks the step first); the xla backend moves them (Backend::copy_to_host / from_host: on pjrt
// one copy out of each gradient's device buffer and one into a new buffer).

#include "distributed/gradient_sync.h"

namespace fulgur::detail {

std::unique_ptr<GradientSync> make_step_reducer(std::vector<at::Tensor> params, std::shared_ptr<Collectives> collectives,
                                                int64_t max_buffer_bytes = 64 << 20,
                                                DDPCommHook comm_hook = DDPCommHook::kNone);

}  // namespace fulgur::detail
