// SPDX-License-Identifier: Apache-2.0
#pragma once
// BasePredictionWriter: Lightning's callback for writing predictions. It runs
// on every rank, so each rank can write its own share (for example to
// predictions_rank<R>.pt); Trainer::predict itself returns rank 0's only.
//
// Example:
//   struct Writer : fulgur::BasePredictionWriter {
//     Writer() : BasePredictionWriter("epoch") {}
//     void write_on_epoch_end(fulgur::Trainer& t, fulgur::LightningModule&,
//                             const std::vector<at::Tensor>& predictions,
//                             const std::vector<std::vector<int64_t>>& batch_indices) override {
//       torch::save(predictions, "predictions_rank" + std::to_string(t.global_rank()) + ".pt");
//     }
//   };

#include <fulgur/callbacks/callback.h>

#include <cstdint>
#include <string>
#include <vector>

namespace fulgur {

class BasePredictionWriter : public Callback {
 public:
  // write_interval: "batch" (write_on_batch_end after each batch), "epoch"
  // (write_on_epoch_end after the last batch) or "batch_and_epoch" (both).
  // Anything else throws std::invalid_argument naming the value.
  explicit BasePredictionWriter(std::string write_interval = "batch");
  std::string state_key() const override { return "BasePredictionWriter"; }
  const std::string& write_interval() const { return write_interval_; }

  // Called on every rank. prediction: predict_step's result on the CPU;
  // batch_indices: the dataset indices of the batch's samples (empty when the
  // loader is not a DataLoader). The defaults throw std::logic_error: a
  // writer overrides the hook(s) its write_interval calls.
  virtual void write_on_batch_end(Trainer& trainer, LightningModule& module, const at::Tensor& prediction,
                                  const std::vector<int64_t>& batch_indices, const Batch& batch, int64_t batch_idx);
  // Called on every rank with all of this rank's predictions and, for each,
  // its batch's dataset indices.
  virtual void write_on_epoch_end(Trainer& trainer, LightningModule& module, const std::vector<at::Tensor>& predictions,
                                  const std::vector<std::vector<int64_t>>& batch_indices);

  void on_predict_batch_end(Trainer& trainer, LightningModule& module, const at::Tensor& prediction, const Batch& batch,
                            int64_t batch_idx) override;
  void on_predict_epoch_end(Trainer& trainer, LightningModule& module) override;

 private:
  std::string write_interval_;
};

}  // namespace fulgur
