// SPDX-License-Identifier: Apache-2.0
#pragma once
// The run's checkpoints (Lightning's trainer/connectors/checkpoint_connector.py): the whole
// state as one dict, its restore with every count checked before it is used, which file
// ckpt_path names, and (in the launching process after a multi-process fit) rank 0's last one.

#include <fulgur/checkpoint.h>

#include <ATen/core/ivalue.h>

#include <optional>
#include <string>

namespace fulgur::detail {

struct TrainerImpl;

class CheckpointConnector {
 public:
  explicit CheckpointConnector(TrainerImpl& trainer) : t_(trainer) {}

  // The run's state in Lightning's layout (docs/ARCHITECTURE.md, checkpoint format), after the
  // module's and the callbacks' on_save_checkpoint. Collective: every rank calls (the
  // generators' states are gathered).
  Checkpoint dump();
  // Loads `path`: the weights for every stage; for fit also the optimizers, schedulers, loop
  // position, precision state, callbacks and generators, then the on_load_checkpoint hooks.
  // Throws std::runtime_error naming the file and the key for anything missing or out of range.
  void restore(const std::string& path);
  // ckpt_path as a file: "best" (ModelCheckpoint's), "last" (the newest last.ckpt), or itself.
  std::string resolve_ckpt_path(const std::string& ckpt_path) const;
  // In a restarted attempt of a launch (max_restarts): the last.ckpt an
  // earlier attempt wrote, else `ckpt_path` (the stage's own). Every rank calls.
  std::string resume_after_restart(const std::string& ckpt_path);

  // state_key() -> state_dict() of each callback that has a state.
  c10::Dict<std::string, c10::IValue> callback_states() const;
  // Gives each callback its entry of `states` (as callback_states made them), if any.
  void load_callback_states(const c10::IValue& states);

  // The launching process of a multi-process fit has no optimizers of its
  // own: rank 0's whole checkpoint at the end of fit comes back with the
  // result, so that Trainer::save_checkpoint after fit is complete there too.
  std::optional<Checkpoint> final_checkpoint;

 private:
  void restore_training_state(Checkpoint& ckpt, const std::string& where);
  void restore_schedulers(const c10::List<c10::IValue>& scheds, const std::string& where);
  // The per-epoch schedulers' step that a checkpoint written before it (at validation end) missed.
  void step_pending_epoch_schedulers(const c10::List<c10::IValue>& scheds);

  TrainerImpl& t_;
};

}  // namespace fulgur::detail
