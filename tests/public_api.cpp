// SPDX-License-Identifier: Apache-2.0
// One translation unit that includes only <fulgur/fulgur.h>, as a user
// program does: it must compile with every public name below.

#include <fulgur/fulgur.h>

#include "public_api.h"

namespace fulgur::testing {

std::vector<std::string> names_from_fulgur_h() {
  std::vector<std::string> seen;
  DDPStrategy ddp(std::make_shared<CPUAccelerator>(), {0, 1});
  ParallelStrategy& parallel = ddp;
  // Both overloads of reduce on a ParallelStrategy: the tensor one and Strategy's IValue one.
  const at::Tensor t = parallel.reduce(at::ones({2}), "sum");
  const c10::IValue v = parallel.reduce(c10::IValue(std::string("not a tensor")), "sum");
  if (t.numel() == 2) seen.push_back("ParallelStrategy::reduce(Tensor)");
  if (v.isString()) seen.push_back("ParallelStrategy::reduce(IValue)");
  XLAStrategy* xla = nullptr;
  if (xla == nullptr) seen.push_back("XLAStrategy");
  if (!strategy_names().empty()) seen.push_back("strategy_names");
  auto loader = std::make_shared<DataLoader>(std::make_shared<TensorDataset>(at::zeros({4, 1}), at::zeros({4})),
                                             DataLoaderOptions(2));
  DeviceLoader device_loader(loader, c10::Device(c10::kCPU));
  if (device_loader.num_batches() == 2) seen.push_back("DeviceLoader");
  const std::shared_ptr<Collectives>& group = ddp.collectives();
  if (!group) seen.push_back("Collectives");
  BasePredictionWriter writer("epoch");
  if (writer.write_interval() == "epoch") seen.push_back("BasePredictionWriter");
  XLAPrecision xla_precision("bf16-true");
  if (xla_precision.dtype() == c10::kBFloat16) seen.push_back("XLAPrecision");
  ModelSummary summary;
  if (summary.state_key() == "ModelSummary") seen.push_back("ModelSummary");
  return seen;
}

}  // namespace fulgur::testing
