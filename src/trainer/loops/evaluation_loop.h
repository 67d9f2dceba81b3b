// SPDX-License-Identifier: Apache-2.0
#pragma once
// Validation and test over a loader (Lightning's loops/evaluation_loop.py): fit's sanity check
// and its validation runs, and the validate and test stages.

#include <fulgur/trainer.h>  // Metrics
#include <fulgur/types.h>

#include "trainer/stop_poll.h"

#include <cstdint>
#include <map>
#include <optional>
#include <string>

namespace fulgur {
class BatchSource;
}

namespace fulgur::detail {

struct TrainerImpl;

class EvaluationLoop {
 public:
  explicit EvaluationLoop(TrainerImpl& trainer) : t_(trainer) {}

  // At a stage's start: where a stop signal ends an evaluation inside fit (empty: signals are
  // not handled, or not a fit), and no stop agreed yet.
  void reset(std::optional<StopPoll> poll) {
    poll_ = std::move(poll);
    stopped_ = false;
  }

  // Runs `stage` (kValidate, kTest, or kSanityCheck: validation whose metrics reach no logger
  // and no on_validation_end) over up to `max_batches` of `source`, with a ResultCollection of
  // its own; returns the epoch metrics, or none when a stop signal ended it (then stopped()).
  Metrics run(Stage stage, BatchSource& source, int64_t max_batches);

  // During fit's sanity check (Trainer::sanity_checking).
  bool sanity_checking() const { return sanity_checking_; }
  // A stop signal ended an evaluation of this stage (every rank agreed): the fit stops too.
  bool stopped() const { return stopped_; }

 private:
  void on_start(bool is_val);
  // The batches, until a stop signal ends them (stopped_).
  void run_batches(bool is_val, BatchSource& source, int64_t max_batches);
  Metrics on_end(bool is_val);

  TrainerImpl& t_;
  std::optional<StopPoll> poll_;
  bool stopped_ = false;
  bool sanity_checking_ = false;
};

}  // namespace fulgur::detail
