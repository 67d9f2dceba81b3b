// SPDX-License-Identifier: Apache-2.0
#pragma once
// Where a fit is, as one value (Lightning's loops keep it in their progress objects): the loops
// advance it, a checkpoint's loops.fit_loop holds it, and a probe (LearningRateFinder) saves and
// puts it back whole.

#include <fulgur/checkpoint.h>

#include <cstdint>
#include <string>
#include <vector>

namespace fulgur::detail {

struct Progress {
  int64_t epoch = 0;
  int64_t global_step = 0;   // optimizer steps taken
  int64_t batches_done = 0;  // batches finished in `epoch`: the resume position
  bool epoch_finished = false;
  // The per-epoch schedulers have taken this epoch's step (they step after the epoch-end hooks,
  // where ModelCheckpoint saves): a checkpoint records it, so that a resumed run takes a step its
  // checkpoint came before.
  bool epoch_schedulers_stepped = false;
  int64_t accumulated = 0;                // micro-batches since the last optimizer step
  std::vector<int64_t> scheduler_counts;  // steps taken by each scheduler (saved with lr_schedulers)

  // A checkpoint's loops.fit_loop: the position, and the world size that wrote it.
  c10::Dict<std::string, c10::IValue> to_ivalue(int64_t world_size) const;
  // The position in `checkpoint`'s loops.fit_loop (`where`: the file, for errors), each count in
  // range (batches_done at most `batches_per_epoch`, this run's). A checkpoint that does not say
  // epoch_schedulers_stepped was written before the step (ModelCheckpoint wrote it so): false.
  // accumulated and scheduler_counts stay 0 and empty (the counts come with lr_schedulers).
  static Progress from_checkpoint(const Checkpoint& checkpoint, const std::string& where, int64_t batches_per_epoch);
};

}  // namespace fulgur::detail
