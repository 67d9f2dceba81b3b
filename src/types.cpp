// SPDX-License-Identifier: Apache-2.0
#include <fulgur/types.h>

#include <stdexcept>

namespace fulgur {

StepOutput::StepOutput(at::Tensor loss) {
  if (loss.defined()) values_.emplace("loss", std::move(loss));
}

StepOutput::StepOutput(std::map<std::string, at::Tensor> values) : values_(std::move(values)) {}

const at::Tensor& StepOutput::loss() const {
  auto it = values_.find("loss");
  if (it == values_.end()) throw std::logic_error("StepOutput has no \"loss\" entry");
  return it->second;
}

const char* to_string(Stage stage) {
  switch (stage) {
    case Stage::kFit: return "fit";
    case Stage::kValidate: return "validate";
    case Stage::kTest: return "test";
    case Stage::kPredict: return "predict";
    case Stage::kSanityCheck: return "sanity_check";
  }
  return "?";
}

}  // namespace fulgur
