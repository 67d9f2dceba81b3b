// SPDX-License-Identifier: Apache-2.0
#pragma once
// ThroughputMonitor: logs training speed as Lightning's ThroughputMonitor (and its Throughput
// window): every logging step (global_step % log_every_n_steps == 0, as the Trainer's own
// rows), rank 0 logs under "train/":
//   time, batches, samples (and lengths with a length_fn): totals of this fit's training;
//   device/batches_per_sec, device/samples_per_sec (device/items_per_sec with a length_fn):
//     rolling averages over the last window_size batches of this rank;
//   batches_per_sec, samples_per_sec, items_per_sec: the same times world_size (world_size > 1);
//   device/flops_per_sec (flops_per_sec with world_size > 1), and device/mfu = device flops/s
//     over available_flops when that is given.
// The FLOPs of a batch: flops_per_batch when given; else, on xla devices compiled by XLA,
// measured: the sum of XLA's cost analysis of every program the batch ran (forward, backward
// and the optimizer's update, as compiled), where Lightning needs the user to count them. The
// time of validation inside fit is not counted as training time.
//
// Example:
//   auto throughput = std::make_shared<fulgur::ThroughputMonitor>(
//       fulgur::ThroughputMonitorOptions().window_size(20).length_fn(
//           [](const fulgur::Batch& b) { return b.data.size(1); }));  // tokens per sequence
//   fulgur::Trainer trainer(fulgur::TrainerOptions().callbacks({throughput}));

#include <fulgur/callbacks/callback.h>

#include <torch/arg.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <string>

namespace fulgur {

struct ThroughputMonitorOptions {
  // Samples in a batch; default: the size of the batch's data along dimension 0.
  TORCH_ARG(std::function<int64_t(const Batch&)>, batch_size_fn) = nullptr;
  // Items (tokens, pixels...) in one sample of the batch, as Lightning's length_fn (a sequence
  // model's sequence length): items_per_sec is samples_per_sec times its average over the
  // window, and "lengths" its sum over batches. Unset: neither is logged.
  TORCH_ARG(std::function<int64_t(const Batch&)>, length_fn) = nullptr;
  // Batches of the rolling average; at least 2 (the rate is over the window's first to last).
  TORCH_ARG(int64_t, window_size) = 100;
  TORCH_ARG(std::string, separator) = "/";
  // FLOPs of one batch on one device; unset: measured on xla (see above), else none.
  TORCH_ARG(std::optional<double>, flops_per_batch) = std::nullopt;
  // The device's peak FLOP/s for the precision in use, for device/mfu; unset: no mfu.
  TORCH_ARG(std::optional<double>, available_flops) = std::nullopt;
};

class ThroughputMonitor : public Callback {
 public:
  // Throws std::invalid_argument naming a window_size below 2, a separator that is empty, or a
  // flops_per_batch or available_flops that is not positive.
  explicit ThroughputMonitor(ThroughputMonitorOptions options = ThroughputMonitorOptions());
  std::string state_key() const override { return "ThroughputMonitor"; }
  void on_fit_start(Trainer&, LightningModule&) override;
  void on_train_start(Trainer&, LightningModule&) override;
  void on_train_batch_end(Trainer&, LightningModule&, const StepOutput&, const Batch&, int64_t) override;
  void on_validation_start(Trainer&, LightningModule&) override;
  void on_validation_end(Trainer&, LightningModule&) override;

  // What the last logging step logged (keys without the "train/" prefix); empty before.
  const std::map<std::string, double>& last_metrics() const { return last_; }
  // The FLOPs of the last batch (given or measured); -1 when unknown.
  double last_batch_flops() const { return last_batch_flops_; }
  const ThroughputMonitorOptions& options() const { return options_; }

 private:
  using Clock = std::chrono::steady_clock;
  double elapsed() const;
  double batch_flops();
  std::map<std::string, double> compute(int64_t world_size) const;

  ThroughputMonitorOptions options_;
  Clock::time_point t0_{};
  bool started_ = false;
  Clock::time_point paused_at_{};
  bool paused_ = false;
  int64_t batches_ = 0, samples_ = 0, lengths_ = 0;
  // The PJRT runtime's counters at the last batch end: executed FLOPs, executions, and
  // executions of programs without a cost analysis.
  double measured_flops_seen_ = 0;
  int64_t seen_executions_ = 0, seen_without_ = 0;
  int64_t logged_step_ = -1;
  double last_batch_flops_ = -1;
  std::deque<double> time_, flops_;
  std::deque<int64_t> batches_w_, samples_w_, lengths_w_;
  std::map<std::string, double> last_;
};

}  // namespace fulgur
