// SPDX-License-Identifier: Apache-2.0
#pragma once
// Callback: code that runs at points of the loop without being part of the model.
// All hooks run on every rank; a callback that writes files checks
// trainer.is_global_zero() or goes through the strategy.

#include <fulgur/checkpoint.h>
#include <fulgur/types.h>

#include <string>

namespace fulgur {

class LightningModule;
class Trainer;

class Callback {
 public:
  virtual ~Callback() = default;
  // Key of this callback's entry in checkpoint["callbacks"]; unique per trainer.
  virtual std::string state_key() const = 0;

  // At the start of every stage, once the strategy has set the module up (on its device, with
  // its optimizers) and before a checkpoint is restored into it.
  virtual void setup(Trainer&, LightningModule&, Stage /*stage*/) {}
  virtual void on_fit_start(Trainer&, LightningModule&) {}
  virtual void on_fit_end(Trainer&, LightningModule&) {}
  // Around the training loop of fit: after the sanity check, and before on_fit_end (not when
  // a stop signal ends fit).
  virtual void on_train_start(Trainer&, LightningModule&) {}
  virtual void on_train_end(Trainer&, LightningModule&) {}
  virtual void on_train_epoch_start(Trainer&, LightningModule&) {}
  virtual void on_train_epoch_end(Trainer&, LightningModule&) {}
  virtual void on_train_batch_end(Trainer&, LightningModule&, const StepOutput&, const Batch&,
                                  int64_t /*batch_idx*/) {}
  virtual void on_validation_start(Trainer&, LightningModule&) {}
  virtual void on_validation_batch_end(Trainer&, LightningModule&, int64_t /*batch_idx*/) {}
  // Around the batches of every validation run, the sanity check's included. The end hook
  // also runs when a stop signal cuts the run short, so that what the start hook changed in
  // the module is undone before the interrupted fit saves its checkpoint.
  virtual void on_validation_epoch_start(Trainer&, LightningModule&) {}
  virtual void on_validation_epoch_end(Trainer&, LightningModule&) {}
  virtual void on_validation_end(Trainer&, LightningModule&) {}
  virtual void on_test_start(Trainer&, LightningModule&) {}
  virtual void on_test_batch_end(Trainer&, LightningModule&, int64_t /*batch_idx*/) {}
  virtual void on_test_end(Trainer&, LightningModule&) {}
  virtual void on_predict_start(Trainer&, LightningModule&) {}
  // prediction: what predict_step returned for this batch, moved to the CPU.
  virtual void on_predict_batch_end(Trainer&, LightningModule&, const at::Tensor& /*prediction*/, const Batch&,
                                    int64_t /*batch_idx*/) {}
  // After the last predict batch of this rank.
  virtual void on_predict_epoch_end(Trainer&, LightningModule&) {}
  virtual void on_predict_end(Trainer&, LightningModule&) {}
  virtual void on_save_checkpoint(Trainer&, LightningModule&, Checkpoint&) {}
  // When fit resumes from `checkpoint`: after the module's weights, the optimizers and every
  // callback's load_state_dict.
  virtual void on_load_checkpoint(Trainer&, LightningModule&, const Checkpoint& /*checkpoint*/) {}

  // State kept in checkpoints so a resumed run continues where it stopped.
  virtual c10::IValue state_dict() const { return c10::IValue(); }
  virtual void load_state_dict(const c10::IValue& /*state*/) {}
};

}  // namespace fulgur
