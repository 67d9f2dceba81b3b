// SPDX-License-Identifier: Apache-2.0
#include <fulgur/callbacks/prediction_writer.h>
#include <fulgur/lightning_module.h>

#include <fulgur/trainer.h>

#include "trainer/run_context.h"

#include <stdexcept>

namespace fulgur {

BasePredictionWriter::BasePredictionWriter(std::string write_interval) : write_interval_(std::move(write_interval)) {
  if (write_interval_ != "batch" && write_interval_ != "epoch" && write_interval_ != "batch_and_epoch") {
    throw std::invalid_argument("BasePredictionWriter: write_interval '" + write_interval_ +
                                "' is not one of 'batch', 'epoch', 'batch_and_epoch'");
  }
}

void BasePredictionWriter::write_on_batch_end(Trainer&, LightningModule&, const at::Tensor&,
                                              const std::vector<int64_t>&, const Batch&, int64_t) {
  throw std::logic_error("BasePredictionWriter with write_interval '" + write_interval_ +
                         "' must override write_on_batch_end");
}

void BasePredictionWriter::write_on_epoch_end(Trainer&, LightningModule&, const std::vector<at::Tensor>&,
                                              const std::vector<std::vector<int64_t>>&) {
  throw std::logic_error("BasePredictionWriter with write_interval '" + write_interval_ +
                         "' must override write_on_epoch_end");
}

void BasePredictionWriter::on_predict_batch_end(Trainer& trainer, LightningModule& module, const at::Tensor& prediction,
                                                const Batch& batch, int64_t batch_idx) {
  if (write_interval_ == "epoch") return;
  write_on_batch_end(trainer, module, prediction, detail::run_context(trainer).predict_batch_indices().back(), batch, batch_idx);
}

void BasePredictionWriter::on_predict_epoch_end(Trainer& trainer, LightningModule& module) {
  if (write_interval_ == "batch") return;
  const auto& context = detail::run_context(trainer);
  write_on_epoch_end(trainer, module, context.predictions(), context.predict_batch_indices());
}

}  // namespace fulgur
