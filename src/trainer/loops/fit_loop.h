// SPDX-License-Identifier: Apache-2.0
#pragma once
// The fit stage (Lightning's loops/fit_loop.py): the sanity check, then epochs of the
// training-epoch loop until max_steps, max_epochs or should_stop; the stop on a signal, with
// last.ckpt; the fit's end hooks and report.

#include "trainer/loops/training_epoch_loop.h"
#include "trainer/stop_poll.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace fulgur {
class BatchSource;
}

namespace fulgur::detail {

struct TrainerImpl;

class FitLoop {
 public:
  explicit FitLoop(TrainerImpl& trainer) : epoch_loop(trainer), t_(trainer) {}

  // At a stage's start: where a stop signal ends the training batches (empty: signals are not
  // handled, or not a fit).
  void reset(std::optional<StopPoll> poll) { poll_ = std::move(poll); }

  // Runs the fit over `train_source` (validating over `val_source`, if set) from progress.
  // Throws WorkerFailure (exit code 128 + the signal) when a stop signal ends it.
  void run();

  // Trainer::should_stop: a callback asks the fit to stop (honoured once min_epochs ran).
  bool should_stop() const { return should_stop_; }
  void set_should_stop(bool value) { should_stop_ = value; }
  // Training batches per epoch and validation batches per run, after limits (0 before run).
  int64_t num_training_batches() const { return epoch_loop.schedule().batches; }
  int64_t num_val_batches() const { return epoch_loop.schedule().val_batches; }

  // Whether every rank agreed on a stop signal after this batch (`last`: the epoch's last
  // batch, where they agree in any case), or an evaluation inside the fit already did.
  bool stop_agreed(bool last);

  // The stage's loaders, as the strategy processed them (run.cpp sets them before run and
  // drops them after the stage).
  std::shared_ptr<BatchSource> train_source;
  std::shared_ptr<BatchSource> val_source;

  TrainingEpochLoop epoch_loop;

 private:
  // Batch counts and the validation interval from the options and the loaders.
  void setup_schedule();
  void on_run_start();
  void sanity_check();
  bool done() const;
  // One epoch; false when the fit ends inside it (max_steps or should_stop mid-epoch).
  bool advance();
  [[noreturn]] void on_interrupt();
  void on_run_end();
  // Why run ended normally: max_steps, EarlyStopping (its metric and value), should_stop,
  // max_epochs.
  std::string stop_reason() const;

  TrainerImpl& t_;
  std::optional<StopPoll> poll_;
  bool should_stop_ = false;
};

}  // namespace fulgur::detail
