// SPDX-License-Identifier: Apache-2.0
#pragma once
// DataModule: the data of a run in one place.

#include <fulgur/data/data_loader.h>

#include <memory>
#include <string>

namespace fulgur {

class DataModule {
 public:
  virtual ~DataModule() = default;
  // Called on every rank before the loaders are asked for; stage is "fit",
  // "validate", "test" or "predict".
  virtual void setup(const std::string& /*stage*/) {}
  virtual std::shared_ptr<BatchSource> train_dataloader() { return nullptr; }
  virtual std::shared_ptr<BatchSource> val_dataloader() { return nullptr; }
  virtual std::shared_ptr<BatchSource> test_dataloader() { return nullptr; }
  virtual std::shared_ptr<BatchSource> predict_dataloader() { return nullptr; }
};

}  // namespace fulgur
