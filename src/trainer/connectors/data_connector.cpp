// SPDX-License-Identifier: Apache-2.0
// The data connector: the stage's loaders, served by the strategy, and their batch limits.

#include "trainer/connectors/data_connector.h"

#include <fulgur/data/data_loader.h>
#include <fulgur/data_module.h>
#include <fulgur/strategies/strategy.h>

#include "trainer/trainer_impl.h"

#include <stdexcept>
#include <string>

namespace fulgur::detail {

void DataConnector::load(StageData& data) {
  if (!data.datamodule) return;
  const Stage stage = t_.stage;
  data.datamodule->setup(to_string(stage));
  if (stage == Stage::kFit) {
    data.train = data.datamodule->train_dataloader();
    data.val = data.datamodule->val_dataloader();
  } else if (stage == Stage::kValidate) {
    data.eval = data.datamodule->val_dataloader();
  } else if (stage == Stage::kTest) {
    data.eval = data.datamodule->test_dataloader();
  } else {
    data.eval = data.datamodule->predict_dataloader();
  }
}

void DataConnector::attach_fit_loaders(const StageData& data) {
  if (!data.train) throw std::invalid_argument("fit: no training loader (pass one, or give the DataModule a train_dataloader)");
  t_.fit_loop.train_source = t_.strategy->process_dataloader(data.train);
  t_.fit_loop.val_source = data.val ? t_.strategy->process_dataloader(data.val) : nullptr;
}

void DataConnector::require_eval_loader(const StageData& data) const {
  if (data.eval) return;
  const Stage stage = t_.stage;
  throw std::invalid_argument(std::string(to_string(stage)) + ": no loader (pass one, or give the DataModule a " +
                              (stage == Stage::kValidate ? "val" : to_string(stage)) + "_dataloader)");
}

DataConnector::EvalSource DataConnector::eval_source(const StageData& data) {
  const Stage stage = t_.stage;
  const TrainerOptions& options = t_.options;
  auto source = t_.strategy->process_dataloader(data.eval);
  const BatchLimit& limit = stage == Stage::kValidate ? options.limit_val_batches()
                            : stage == Stage::kTest   ? options.limit_test_batches()
                                                      : options.limit_predict_batches();
  const char* what = stage == Stage::kValidate ? "limit_val_batches"
                     : stage == Stage::kTest   ? "limit_test_batches"
                                               : "limit_predict_batches";
  const int64_t batches = t_.resolved.batches(limit, source->num_batches(), what);
  return {std::move(source), batches};
}

}  // namespace fulgur::detail
