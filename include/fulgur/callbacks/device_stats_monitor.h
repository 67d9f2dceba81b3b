// SPDX-License-Identifier: Apache-2.0
#pragma once
// DeviceStatsMonitor: logs the accelerator's statistics of this rank's device
// (Accelerator::get_device_stats) as Lightning's DeviceStatsMonitor, at the end of each
// training batch that the Trainer logs (global_step % log_every_n_steps == 0), under
// "DeviceStatsMonitor.on_train_batch_end/<name>":
//   cpu: the host's (cpu_percent, cpu_vm_percent, cpu_swap_percent, process_rss_bytes,
//        process_peak_rss_bytes);
//   xla: the device's allocator statistics from the PJRT plugin (bytes_in_use,
//        peak_bytes_in_use, bytes_limit... as the plugin gives them); the CPU plugin has none,
//        and its device memory is the host's, so the host's there;
//   cuda: the host's.
// cpu_stats(true) adds the host's statistics beside the device's (Lightning's cpu_stats).
// Only global rank 0's are logged, as the loggers write on rank 0.
//
// Example:
//   fulgur::Trainer trainer(fulgur::TrainerOptions().callbacks(
//       {std::make_shared<fulgur::DeviceStatsMonitor>()}));

#include <fulgur/callbacks/callback.h>

#include <map>
#include <string>

namespace fulgur {

class DeviceStatsMonitor : public Callback {
 public:
  explicit DeviceStatsMonitor(bool cpu_stats = false) : cpu_stats_(cpu_stats) {}
  std::string state_key() const override { return "DeviceStatsMonitor"; }
  void on_train_batch_end(Trainer&, LightningModule&, const StepOutput&, const Batch&, int64_t) override;
  // What the last logged batch logged (full names); empty before.
  const std::map<std::string, double>& last_stats() const { return last_; }

 private:
  bool cpu_stats_;
  int64_t logged_step_ = -1;
  std::map<std::string, double> last_;
};

}  // namespace fulgur
