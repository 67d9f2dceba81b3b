// SPDX-License-Identifier: Apache-2.0
// The evaluation loop: validation (fit's sanity check and its runs, the validate stage) and test.

#include "trainer/loops/evaluation_loop.h"

#include <fulgur/callbacks/callback.h>
#include <fulgur/data/data_loader.h>
#include <fulgur/lightning_module.h>
#include <fulgur/strategies/strategy.h>

#include "trainer/trainer_impl.h"

namespace fulgur::detail {

Metrics EvaluationLoop::run(Stage stage, BatchSource& source, int64_t max_batches) {
  const bool is_val = stage == Stage::kValidate || stage == Stage::kSanityCheck;
  sanity_checking_ = stage == Stage::kSanityCheck;
  ResultCollection saved = std::move(t_.logging.results);
  t_.logging.results = ResultCollection();
  LightningModule& model = *t_.model;
  const bool was_training = model.is_training();
  model.eval();
  on_start(is_val);
  Metrics metrics;
  run_batches(is_val, source, max_batches);
  if (!stopped_) {
    metrics = on_end(is_val);
  } else {
    // Stopped by a signal part-way: no epoch end, so nothing (ModelCheckpoint,
    // EarlyStopping) acts on a partial evaluation; only the callbacks' epoch-end hooks run,
    // which undo what their start hooks changed in the module (WeightAveraging's swap).
    if (is_val)
      for (auto& c : t_.callbacks) c->on_validation_epoch_end(t_.owner, model);
  }
  if (was_training) model.train();
  t_.logging.results = std::move(saved);
  sanity_checking_ = false;
  return metrics;
}

void EvaluationLoop::on_start(bool is_val) {
  LightningModule& model = *t_.model;
  if (is_val) {
    for (auto& c : t_.callbacks) c->on_validation_start(t_.owner, model);
    model.on_validation_epoch_start();
    for (auto& c : t_.callbacks) c->on_validation_epoch_start(t_.owner, model);
  } else {
    for (auto& c : t_.callbacks) c->on_test_start(t_.owner, model);
  }
}

void EvaluationLoop::run_batches(bool is_val, BatchSource& source, int64_t max_batches) {
  auto stream = source.open(0);
  for (int64_t i = 0; i < max_batches; ++i) {
    auto batch = stream->next();
    if (!batch) break;
    t_.logging.current_batch_size = batch_size_of(*batch);
    if (is_val) {
      t_.strategy->validation_step(*batch, i);
      for (auto& c : t_.callbacks) c->on_validation_batch_end(t_.owner, *t_.model, i);
    } else {
      t_.strategy->test_step(*batch, i);
      for (auto& c : t_.callbacks) c->on_test_batch_end(t_.owner, *t_.model, i);
    }
    if (poll_stop_signal(poll_, false)) {
      stopped_ = true;
      return;
    }
  }
}

Metrics EvaluationLoop::on_end(bool is_val) {
  LightningModule& model = *t_.model;
  if (is_val) {
    model.on_validation_epoch_end();
    for (auto& c : t_.callbacks) c->on_validation_epoch_end(t_.owner, model);
  } else {
    model.on_test_epoch_end();
  }
  auto values = t_.logging.results.epoch_values(t_.logging.reducer());
  const Metrics metrics = to_doubles(values);
  if (!sanity_checking_) t_.logging.log_epoch_metrics(values, metrics, t_.progress.global_step);
  if (is_val) {
    if (!sanity_checking_)
      for (auto& c : t_.callbacks) c->on_validation_end(t_.owner, model);
  } else {
    for (auto& c : t_.callbacks) c->on_test_end(t_.owner, model);
  }
  return metrics;
}

}  // namespace fulgur::detail
