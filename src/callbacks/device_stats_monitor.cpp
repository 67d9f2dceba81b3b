// SPDX-License-Identifier: Apache-2.0
#include <fulgur/accelerators/accelerator.h>
#include <fulgur/callbacks/device_stats_monitor.h>
#include <fulgur/loggers/logger.h>
#include <fulgur/strategies/strategy.h>
#include <fulgur/trainer.h>

namespace fulgur {

void DeviceStatsMonitor::on_train_batch_end(Trainer& trainer, LightningModule&, const StepOutput&, const Batch&,
                                            int64_t) {
  if (trainer.global_step() % trainer.options().log_every_n_steps() != 0 || trainer.global_step() == logged_step_) {
    return;
  }
  logged_step_ = trainer.global_step();
  if (!trainer.is_global_zero() || trainer.loggers().empty()) return;
  Strategy& strategy = trainer.strategy();
  std::map<std::string, double> stats = strategy.accelerator().get_device_stats(strategy.root_device());
  if (cpu_stats_ && strategy.accelerator().name() != "cpu") {
    stats.merge(strategy.accelerator().Accelerator::get_device_stats(c10::Device(c10::kCPU)));
  }
  last_.clear();
  for (const auto& [k, v] : stats) last_["DeviceStatsMonitor.on_train_batch_end/" + k] = v;
  for (const auto& l : trainer.loggers()) l->log_metrics(last_, trainer.global_step());
}

}  // namespace fulgur
