// SPDX-License-Identifier: Apache-2.0
#pragma once
// GradientAccumulationScheduler: changes how many batches' gradients are
// summed before each optimizer step, by epoch (Lightning's).
//
// Example:
//   // Epochs 0-3: a step per batch; 4-7: every 2 batches; from 8 on: every 4.
//   auto accumulate = std::make_shared<fulgur::GradientAccumulationScheduler>(
//       std::map<int64_t, int64_t>{{4, 2}, {8, 4}});
//   fulgur::Trainer trainer(fulgur::TrainerOptions().callbacks({accumulate}));

#include <fulgur/callbacks/callback.h>

#include <cstdint>
#include <map>
#include <string>

namespace fulgur {

class GradientAccumulationScheduler : public Callback {
 public:
  // scheduling: first epoch (zero-based) -> batches to accumulate from that
  // epoch until the next key. Epochs before the smallest key accumulate 1.
  // Throws std::invalid_argument for an empty map, an epoch < 0 or a count
  // < 1, naming the values. A Trainer whose accumulate_grad_batches is not 1
  // refuses it (one of the two must decide), and it refuses manual
  // optimization at fit start (std::logic_error).
  explicit GradientAccumulationScheduler(std::map<int64_t, int64_t> scheduling);
  std::string state_key() const override { return "GradientAccumulationScheduler"; }

  // The count for `epoch`.
  int64_t get_accumulate_grad_batches(int64_t epoch) const;
  // Whether any epoch accumulates more than one batch.
  bool going_to_accumulate_grad_batches() const;
  const std::map<int64_t, int64_t>& scheduling() const { return scheduling_; }

  void on_train_start(Trainer&, LightningModule&) override;
  void on_train_epoch_start(Trainer&, LightningModule&) override;

 private:
  std::map<int64_t, int64_t> scheduling_;
};

}  // namespace fulgur
