// SPDX-License-Identifier: Apache-2.0
#pragma once
// LearningRateMonitor: logs each optimizer's learning rate as "lr-<Name>"
// (or the scheduler's name), per step or per epoch.

#include <fulgur/callbacks/callback.h>

#include <string>

namespace fulgur {

class LearningRateMonitor : public Callback {
 public:
  // interval: "step" or "epoch"; anything else throws std::invalid_argument.
  explicit LearningRateMonitor(std::string logging_interval = "epoch");
  std::string state_key() const override { return "LearningRateMonitor"; }
  void on_train_batch_end(Trainer&, LightningModule&, const StepOutput&, const Batch&, int64_t) override;
  void on_train_epoch_start(Trainer&, LightningModule&) override;

 private:
  void log_lrs(Trainer& trainer);
  std::string interval_;
};

}  // namespace fulgur
