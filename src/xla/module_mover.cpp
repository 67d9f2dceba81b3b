#include "xla/module_mover.h"

#include <torch/torch.h>

namespace fulgur {

void move_module(torch::nn::Module& module, const c10::Device& device) { module.to(device); }

}  // namespace fulgur
