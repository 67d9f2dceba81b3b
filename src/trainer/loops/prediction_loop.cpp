// SPDX-License-Identifier: Apache-2.0
// The prediction loop.

#include "trainer/loops/prediction_loop.h"

#include <fulgur/callbacks/callback.h>
#include <fulgur/data/data_loader.h>
#include <fulgur/data/device_loader.h>
#include <fulgur/lightning_module.h>
#include <fulgur/strategies/strategy.h>

#include "trainer/trainer_impl.h"

namespace fulgur::detail {
namespace {

// The DataLoader that yields `source`'s batches (inside DeviceLoaders), or nullptr.
const DataLoader* underlying_data_loader(const BatchSource& source) {
  if (const auto* device = dynamic_cast<const DeviceLoader*>(&source)) return underlying_data_loader(*device->inner());
  return dynamic_cast<const DataLoader*>(&source);
}

}  // namespace

void PredictionLoop::run(BatchSource& source, int64_t max_batches) {
  LightningModule& model = *t_.model;
  model.eval();
  clear();
  const DataLoader* data_loader = underlying_data_loader(source);
  const std::vector<std::vector<int64_t>> indices =
      data_loader ? data_loader->batch_indices() : std::vector<std::vector<int64_t>>();
  for (auto& c : t_.callbacks) c->on_predict_start(t_.owner, model);
  {
    auto stream = source.open(0);
    for (int64_t i = 0; i < max_batches; ++i) {
      auto batch = stream->next();
      if (!batch) break;
      predictions_.push_back(t_.strategy->predict_step(*batch, i).to(at::kCPU));
      batch_indices_.push_back(static_cast<size_t>(i) < indices.size() ? indices[i] : std::vector<int64_t>());
      for (auto& c : t_.callbacks) c->on_predict_batch_end(t_.owner, model, predictions_.back(), *batch, i);
    }
  }
  for (auto& c : t_.callbacks) c->on_predict_epoch_end(t_.owner, model);
  for (auto& c : t_.callbacks) c->on_predict_end(t_.owner, model);
}

}  // namespace fulgur::detail
