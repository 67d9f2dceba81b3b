// SPDX-License-Identifier: Apache-2.0
#include <fulgur/callbacks/throughput_monitor.h>
#include <fulgur/lightning_module.h>
#include <fulgur/loggers/logger.h>
#include <fulgur/trainer.h>

#include "xla/pjrt/metrics.h"

#include <numeric>
#include <stdexcept>

namespace fulgur {
namespace {

template <typename T>
void push(std::deque<T>& window, T value, int64_t size) {
  window.push_back(value);
  if (static_cast<int64_t>(window.size()) > size) window.pop_front();
}

}  // namespace

ThroughputMonitor::ThroughputMonitor(ThroughputMonitorOptions options) : options_(std::move(options)) {
  if (options_.window_size() < 2) {
    throw std::invalid_argument("ThroughputMonitor: window_size=" + std::to_string(options_.window_size()) +
                                " must be >= 2 (the rate is taken between the window's first and last batch)");
  }
  if (options_.separator().empty()) throw std::invalid_argument("ThroughputMonitor: separator must not be empty");
  if (options_.flops_per_batch() && !(*options_.flops_per_batch() > 0)) {
    throw std::invalid_argument("ThroughputMonitor: flops_per_batch=" + std::to_string(*options_.flops_per_batch()) +
                                " must be > 0 (leave it unset to measure it on xla)");
  }
  if (options_.available_flops() && !(*options_.available_flops() > 0)) {
    throw std::invalid_argument("ThroughputMonitor: available_flops=" + std::to_string(*options_.available_flops()) +
                                " must be > 0 (the device's peak FLOP/s), or unset for no mfu");
  }
}

double ThroughputMonitor::elapsed() const {
  return std::chrono::duration<double>(Clock::now() - t0_).count();
}

void ThroughputMonitor::on_fit_start(Trainer&, LightningModule&) {
  started_ = paused_ = false;
  batches_ = samples_ = lengths_ = 0;
  last_batch_flops_ = -1;
  logged_step_ = -1;
  time_.clear();
  flops_.clear();
  batches_w_.clear();
  samples_w_.clear();
  lengths_w_.clear();
  last_.clear();
}

// The clock starts with training, after the sanity check, as Lightning's.
void ThroughputMonitor::on_train_start(Trainer&, LightningModule&) {
  started_ = true;
  t0_ = Clock::now();
  const xla::pjrt::RuntimeMetrics m = xla::pjrt::runtime_metrics();
  measured_flops_seen_ = m.executed_flops;
  seen_executions_ = m.executions;
  seen_without_ = m.executions_without_flops;
}

void ThroughputMonitor::on_validation_start(Trainer& trainer, LightningModule&) {
  if (!started_ || trainer.sanity_checking()) return;
  paused_ = true;
  paused_at_ = Clock::now();
}

// Validation inside fit is not training time: the clock's origin moves by its duration.
void ThroughputMonitor::on_validation_end(Trainer&, LightningModule&) {
  if (!paused_) return;
  paused_ = false;
  t0_ += Clock::now() - paused_at_;
}

// Given, or measured: the FLOPs XLA's cost analysis gives the programs that ran since the last
// batch end, when every one of them had a cost analysis. Unknown (-1) when no program ran
// (eager devices) or one had none.
double ThroughputMonitor::batch_flops() {
  const xla::pjrt::RuntimeMetrics m = xla::pjrt::runtime_metrics();
  const double delta = m.executed_flops - measured_flops_seen_;
  const bool ran = m.executions > seen_executions_;
  const bool all_known = m.executions_without_flops == seen_without_;
  measured_flops_seen_ = m.executed_flops;
  seen_executions_ = m.executions;
  seen_without_ = m.executions_without_flops;
  if (options_.flops_per_batch()) return *options_.flops_per_batch();
  return ran && all_known && delta > 0 ? delta : -1;
}

void ThroughputMonitor::on_train_batch_end(Trainer& trainer, LightningModule&, const StepOutput&, const Batch& batch,
                                           int64_t) {
  if (!started_) return;
  const double t = elapsed();
  ++batches_;
  samples_ += options_.batch_size_fn() ? options_.batch_size_fn()(batch)
                                       : (batch.data.defined() && batch.data.dim() > 0 ? batch.data.size(0) : 1);
  if (options_.length_fn()) lengths_ += options_.length_fn()(batch);
  last_batch_flops_ = batch_flops();
  const int64_t w = options_.window_size();
  push(time_, t, w);
  push(batches_w_, batches_, w);
  push(samples_w_, samples_, w);
  if (options_.length_fn()) push(lengths_w_, lengths_, w);
  if (last_batch_flops_ > 0) {
    push(flops_, last_batch_flops_, w);
  } else {
    flops_.clear();  // a window of FLOPs is over consecutive batches whose FLOPs are known
  }
  // Logged when the Trainer logs its own step rows; under gradient accumulation, after the
  // optimizer step that ends the accumulation (the global step has moved on).
  const int64_t every = trainer.options().log_every_n_steps();
  if (trainer.global_step() % every != 0 || trainer.global_step() == logged_step_) return;
  logged_step_ = trainer.global_step();
  last_ = compute(trainer.world_size());
  if (!trainer.is_global_zero() || trainer.loggers().empty()) return;
  std::map<std::string, double> row;
  for (const auto& [k, v] : last_) row["train" + options_.separator() + k] = v;
  for (const auto& l : trainer.loggers()) l->log_metrics(row, trainer.global_step());
}

std::map<std::string, double> ThroughputMonitor::compute(int64_t world_size) const {
  const std::string dev = "device" + options_.separator();
  std::map<std::string, double> m;
  m["time"] = time_.back();
  m["batches"] = static_cast<double>(batches_);
  m["samples"] = static_cast<double>(samples_);
  if (options_.length_fn()) m["lengths"] = static_cast<double>(lengths_);
  const bool global = world_size > 1;
  const auto n = static_cast<double>(world_size);
  const size_t w = static_cast<size_t>(options_.window_size());
  const double span = time_.size() == w ? time_.back() - time_.front() : 0;
  if (span > 0) {
    const double batches_per_sec = static_cast<double>(batches_w_.back() - batches_w_.front()) / span;
    const double samples_per_sec = static_cast<double>(samples_w_.back() - samples_w_.front()) / span;
    m[dev + "batches_per_sec"] = batches_per_sec;
    m[dev + "samples_per_sec"] = samples_per_sec;
    if (global) {
      m["batches_per_sec"] = batches_per_sec * n;
      m["samples_per_sec"] = samples_per_sec * n;
    }
    if (lengths_w_.size() == w) {
      const double avg_length = static_cast<double>(lengths_w_.back() - lengths_w_.front()) /
                                static_cast<double>(batches_w_.back() - batches_w_.front());
      m[dev + "items_per_sec"] = samples_per_sec * avg_length;
      if (global) m["items_per_sec"] = samples_per_sec * avg_length * n;
    }
  }
  if (span > 0 && flops_.size() == w) {
    // The first batch of the window ends at its first time: its FLOPs are before the span.
    const double flops = std::accumulate(flops_.begin(), flops_.end(), 0.0) - flops_.front();
    const double device_flops_per_sec = flops / span;
    m[dev + "flops_per_sec"] = device_flops_per_sec;
    if (global) m["flops_per_sec"] = device_flops_per_sec * n;
    if (options_.available_flops()) m[dev + "mfu"] = device_flops_per_sec / *options_.available_flops();
  }
  return m;
}

}  // namespace fulgur
