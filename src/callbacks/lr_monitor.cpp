// SPDX-License-Identifier: Apache-2.0
#include <fulgur/callbacks/lr_monitor.h>
#include <fulgur/lightning_module.h>
#include <fulgur/loggers/logger.h>
#include <fulgur/trainer.h>

#include "optim/optim_state.h"

#include <stdexcept>

namespace fulgur {
namespace {

// Python's class name of a known optimizer (or of its known base), else "Optimizer".
std::string optimizer_name(const torch::optim::Optimizer& o) {
  const detail::OptimizerAdapter* a = detail::optimizer_adapter(o);
  return a ? a->name : "Optimizer";
}

}  // namespace

LearningRateMonitor::LearningRateMonitor(std::string logging_interval) : interval_(std::move(logging_interval)) {
  if (interval_ != "step" && interval_ != "epoch") {
    throw std::invalid_argument("LearningRateMonitor: logging_interval '" + interval_ +
                                "' is not known; valid: \"step\", \"epoch\"");
  }
}

void LearningRateMonitor::log_lrs(Trainer& trainer) {
  if (!trainer.is_global_zero() || trainer.loggers().empty()) return;
  const auto& cfg = trainer.optimizer_config();
  std::map<std::string, double> row;
  std::map<std::string, int> seen;
  for (size_t i = 0; i < cfg.optimizers.size(); ++i) {
    std::string name = "lr-" + optimizer_name(*cfg.optimizers[i]);
    for (const auto& s : cfg.schedulers)
      if (s.optimizer_index() == static_cast<int64_t>(i) && !s.name().empty()) name = s.name();
    if (int n = seen[name]++; n > 0) name += "-" + std::to_string(n);
    const auto& groups = cfg.optimizers[i]->param_groups();
    for (size_t g = 0; g < groups.size(); ++g) {
      row[groups.size() > 1 ? name + "/pg" + std::to_string(g + 1) : name] = groups[g].options().get_lr();
    }
  }
  if (row.empty()) return;
  for (const auto& l : trainer.loggers()) l->log_metrics(row, trainer.global_step());
}

void LearningRateMonitor::on_train_batch_end(Trainer& trainer, LightningModule&, const StepOutput&, const Batch&, int64_t) {
  if (interval_ == "step") log_lrs(trainer);
}

void LearningRateMonitor::on_train_epoch_start(Trainer& trainer, LightningModule&) {
  if (interval_ == "epoch") log_lrs(trainer);
}

}  // namespace fulgur
