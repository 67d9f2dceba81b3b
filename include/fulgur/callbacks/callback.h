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

  virtual void on_fit_start(Trainer&, LightningModule&) {}
  virtual void on_fit_end(Trainer&, LightningModule&) {}
  virtual void on_train_epoch_start(Trainer&, LightningModule&) {}
  virtual void on_train_epoch_end(Trainer&, LightningModule&) {}
  virtual void on_train_batch_end(Trainer&, LightningModule&, const StepOutput&, const Batch&,
                                  int64_t /*batch_idx*/) {}
  virtual void on_validation_start(Trainer&, LightningModule&) {}
  virtual void on_validation_batch_end(Trainer&, LightningModule&, int64_t /*batch_idx*/) {}
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

  // State kept in checkpoints so a resumed run continues where it stopped.
  virtual c10::IValue state_dict() const { return c10::IValue(); }
  virtual void load_state_dict(const c10::IValue& /*state*/) {}
};

}  // namespace fulgur
