// SPDX-License-Identifier: Apache-2.0
#pragma once
// One epoch of training batches (Lightning's loops/training_epoch_loop.py): each batch's
// hooks and optimization, the step rows to the loggers, validation at its interval, the
// schedulers, and the stop checks between batches.

#include <fulgur/types.h>

#include "trainer/loops/optimization.h"

#include <cstdint>
#include <string>

namespace fulgur {
class BatchSource;
}

namespace fulgur::detail {

struct TrainerImpl;

class TrainingEpochLoop {
 public:
  // How many batches an epoch runs and when it validates, set by the fit loop at its start.
  struct Schedule {
    int64_t batches = 0;        // training batches per epoch, after limits
    int64_t val_every = 0;      // validate after every val_every-th batch
    int64_t val_batches = 0;    // per validation run; 0 without a val loader
    bool val_at_end = false;    // val_check_interval is a fraction: validate at the epoch's last batch too
  };

  explicit TrainingEpochLoop(TrainerImpl& trainer) : automatic(trainer), manual(trainer), t_(trainer) {}

  void set_schedule(const Schedule& schedule) { schedule_ = schedule; }
  const Schedule& schedule() const { return schedule_; }

  // Runs the epoch's batches from progress.batches_done over `train` (validating over `val`,
  // when the schedule has val batches). True when a stop signal ended it (every rank agreed);
  // false when the epoch ran out, or max_steps or should_stop ended it.
  bool run(BatchSource& train, BatchSource* val);

  // One batch: its start hooks, training_step and the optimization, the step metrics and the
  // end hooks. `last`: the epoch's last batch.
  void run_batch(const Batch& batch, int64_t batch_idx, bool last);

  // The schedulers of `interval` ("step" or "epoch") whose frequency is due; none while paused.
  void step_schedulers(const std::string& interval);
  // While a probe (RunContext::run_probe) runs, the module's schedulers take no step.
  void pause_schedulers(bool paused) { schedulers_paused_ = paused; }

  // Whether training_step is running, under either optimization.
  bool in_training_step() const { return automatic.in_training_step() || manual.in_training_step(); }

  AutomaticOptimization automatic;
  ManualOptimization manual;

 private:
  bool should_check_val(int64_t batch_idx, bool last) const;

  TrainerImpl& t_;
  Schedule schedule_;
  bool schedulers_paused_ = false;
};

}  // namespace fulgur::detail
