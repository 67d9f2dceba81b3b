// SPDX-License-Identifier: Apache-2.0
#pragma once
// The predict stage over a loader (Lightning's loops/prediction_loop.py): it keeps this rank's
// predictions and each one's dataset indices.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace fulgur {
class BatchSource;
}

namespace fulgur::detail {

struct TrainerImpl;

class PredictionLoop {
 public:
  explicit PredictionLoop(TrainerImpl& trainer) : t_(trainer) {}

  // Runs predict_step over up to `max_batches` of `source`, replacing the predictions.
  void run(BatchSource& source, int64_t max_batches);

  // This rank's predictions (CPU tensors) of the current or last predict run; in the
  // launching process after a multi-process run, rank 0's (set_predictions).
  const std::vector<at::Tensor>& predictions() const { return predictions_; }
  // The dataset indices of each batch in predictions() (empty lists when the source is not a
  // DataLoader, whose indices are unknown). This rank's.
  const std::vector<std::vector<int64_t>>& batch_indices() const { return batch_indices_; }
  void clear() {
    predictions_.clear();
    batch_indices_.clear();
  }
  // Rank 0's predictions, brought back to the launching process (worker_result.cpp).
  void set_predictions(std::vector<at::Tensor> predictions) { predictions_ = std::move(predictions); }

 private:
  TrainerImpl& t_;
  std::vector<at::Tensor> predictions_;
  std::vector<std::vector<int64_t>> batch_indices_;
};

}  // namespace fulgur::detail
