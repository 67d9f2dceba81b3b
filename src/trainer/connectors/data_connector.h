// SPDX-License-Identifier: Apache-2.0
#pragma once
// Where a stage's batches come from (Lightning's trainer/connectors/data_connector.py): the
// loaders given or the DataModule's, as the strategy serves them (a DistributedSampler shard, a
// DeviceLoader), and how many batches each loop runs after the limit_*_batches options.

#include <fulgur/types.h>

#include <cstdint>
#include <memory>

namespace fulgur {
class BatchSource;
class DataModule;
}

namespace fulgur::detail {

struct TrainerImpl;

// The loaders a stage was given (the façade makes it; the worker reads it after setup).
struct StageData {
  // The DataModule's loaders for the stage.
  static StageData from(DataModule& datamodule) {
    StageData d;
    d.datamodule = &datamodule;
    return d;
  }
  // The loaders given: `loader` trains under fit (with `val_loader`, if any)
  // and is `eval` for the other stages.
  static StageData from(Stage stage, std::shared_ptr<BatchSource> loader,
                        std::shared_ptr<BatchSource> val_loader = nullptr) {
    StageData d;
    (stage == Stage::kFit ? d.train : d.eval) = std::move(loader);
    d.val = std::move(val_loader);
    return d;
  }

  DataModule* datamodule = nullptr;
  std::shared_ptr<BatchSource> train;
  std::shared_ptr<BatchSource> val;
  std::shared_ptr<BatchSource> eval;  // validate / test / predict
};

class DataConnector {
 public:
  explicit DataConnector(TrainerImpl& trainer) : t_(trainer) {}

  // With a DataModule: its setup for the running stage, then its loaders for it (into `data`).
  void load(StageData& data);
  // fit: the training loader and the validation one (if any), as the strategy serves them, into
  // the fit loop. Throws std::invalid_argument without a training loader.
  void attach_fit_loaders(const StageData& data);
  // validate, test, predict: throws std::invalid_argument when the stage has no loader.
  void require_eval_loader(const StageData& data) const;
  // The stage's loader as the strategy serves it, and the batches its limit option allows.
  struct EvalSource {
    std::shared_ptr<BatchSource> source;
    int64_t batches = 0;
  };
  EvalSource eval_source(const StageData& data);

 private:
  TrainerImpl& t_;
};

}  // namespace fulgur::detail
