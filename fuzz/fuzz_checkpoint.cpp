// SPDX-License-Identifier: Apache-2.0
// libFuzzer target: a checkpoint file as the trainer reads it on resume. The
// bytes go through the checked archive reader; what it returns is handed to
// the same consumers a resume uses (the model's state_dict, the first
// optimizer's state). Any input must load or throw a std::exception; a
// crash, a sanitizer report or an allocation larger than the input is a bug.

#include "serialize/torch_archive.h"
#include "optim/optim_state.h"

#include <fulgur/checkpoint.h>

#include <torch/torch.h>

#include <cstddef>
#include <cstdint>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static torch::nn::Linear model(3, 2);
  try {
    const c10::IValue v = fulgur::detail::load_torch_archive(data, size, "fuzz input");
    const auto ck = fulgur::detail::as_str_dict(v, "fuzz input");
    if (ck.contains("state_dict")) {
      fulgur::load_state_dict(*model, fulgur::detail::as_str_dict(ck.at("state_dict"), "state_dict"), false, "fuzz input");
    }
    if (ck.contains("optimizer_states") && ck.at("optimizer_states").isList() &&
        ck.at("optimizer_states").toList().size() > 0) {
      torch::optim::Adam adam(model->parameters());
      fulgur::detail::load_optimizer_state_dict(adam, ck.at("optimizer_states").toList().get(0), "fuzz input");
    }
  } catch (const std::exception&) {
  }
  return 0;
}
