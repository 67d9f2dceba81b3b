// SPDX-License-Identifier: Apache-2.0
#pragma once
// DDPCommHook: how gradients travel in a data-parallel strategy's all-reduce
// (ParallelOptions::ddp_comm_hook, StrategyRequest::ddp_comm_hook).

#include <string>

namespace fulgur {

// What a gradient bucket becomes on the wire: the communication hooks of
// PyTorch DDP (torch.distributed.algorithms.ddp_comm_hooks) that fulgur has.
enum class DDPCommHook {
  // The bucket as it is: float32 gradients are summed in float32.
  kNone,
  // bf16_compress_hook: a float32 or float64 bucket is cast to bfloat16,
  // all-reduced (Gloo sums in bfloat16), cast back, and divided by the world
  // size in the bucket's dtype. Half the bytes of float32 on the wire; each
  // gradient keeps 8 significant bits, and every rank ends with the same
  // values. Buckets of other dtypes travel as they are.
  kBf16Compress,
};

// "none" or "bf16_compress_hook" (the Python hook's name; "bf16" too); anything else throws
// std::invalid_argument naming the value and the valid names.
DDPCommHook parse_ddp_comm_hook(const std::string& name);

}  // namespace fulgur
