// SPDX-License-Identifier: Apache-2.0
#include <fulgur/callbacks/progress_bar.h>
#include <fulgur/lightning_module.h>
#include <fulgur/trainer.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <sstream>

namespace fulgur {
namespace {

constexpr std::chrono::milliseconds kRedraw{100};

std::string fmt(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.4g", v);
  return buf;
}

}  // namespace

ProgressBar::ProgressBar(ProgressBarOptions options)
    : options_(options), terminal_(options.terminal().value_or(::isatty(STDOUT_FILENO) == 1)) {}

std::ostream& ProgressBar::out() const { return options_.stream() ? *options_.stream() : std::cout; }

std::string ProgressBar::render(Trainer& trainer, int64_t batch_idx, int64_t total) const {
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - epoch_start_).count();
  std::ostringstream os;
  os << "Epoch " << trainer.current_epoch() << ": " << batch_idx << "/" << total;
  if (total > 0) os << " (" << (100 * batch_idx / total) << "%)";
  // The ETA of the epoch at the rate of the batches seen so far in it.
  const double rate = secs > 0 ? static_cast<double>(batches_seen_) / secs : 0.0;
  char buf[96];
  if (rate > 0 && total >= batch_idx) {
    std::snprintf(buf, sizeof(buf), " [%.1fs, ETA %.1fs, %.1f it/s]", secs, static_cast<double>(total - batch_idx) / rate,
                  rate);
  } else {
    std::snprintf(buf, sizeof(buf), " [%.1fs, ETA ?, %.1f it/s]", secs, rate);
  }
  os << buf;
  for (const auto& [k, v] : trainer.progress_bar_metrics()) os << " " << k << "=" << fmt(v);
  return os.str();
}

void ProgressBar::on_train_epoch_start(Trainer& trainer, LightningModule&) {
  // With max_steps inside this epoch, the epoch ends there (as Lightning shows it).
  epoch_total_ = trainer.num_training_batches();
  if (trainer.max_steps() > 0) {
    epoch_total_ = std::min(epoch_total_, std::max<int64_t>(0, trainer.max_steps() - trainer.global_step()));
  }
  epoch_start_ = std::chrono::steady_clock::now();
  last_draw_ = epoch_start_ - kRedraw;
  batches_seen_ = 0;
}

void ProgressBar::on_train_batch_end(Trainer& trainer, LightningModule&, const StepOutput&, const Batch&,
                                     int64_t batch_idx) {
  ++batches_seen_;
  if (!trainer.is_global_zero() || trainer.sanity_checking()) return;
  const int64_t total = epoch_total_;
  const int64_t done = batch_idx + 1;
  if (terminal_) {
    // Redraw at most every 100 ms (reading metrics is a host sync on xla devices).
    const auto now = std::chrono::steady_clock::now();
    const bool due = options_.print_every() > 0 ? done % options_.print_every() == 0 : now - last_draw_ >= kRedraw;
    if (!due && done != total) return;
    last_draw_ = now;
    out() << "\r" << render(trainer, done, total) << "\033[K" << std::flush;
    return;
  }
  const int64_t every = options_.print_every() > 0 ? options_.print_every() : std::max<int64_t>(1, total / 10);
  if (done % every == 0 || done == total) out() << render(trainer, done, total) << "\n" << std::flush;
}

void ProgressBar::on_train_epoch_end(Trainer& trainer, LightningModule&) {
  if (!trainer.is_global_zero()) return;
  if (terminal_) {
    out() << "\r" << render(trainer, epoch_total_, epoch_total_) << "\033[K\n" << std::flush;
  }
}

void ProgressBar::on_validation_end(Trainer& trainer, LightningModule&) {
  if (!trainer.is_global_zero() || terminal_) return;
  std::ostringstream os;
  os << "Validation (epoch " << trainer.current_epoch() << "):";
  for (const auto& [k, v] : trainer.progress_bar_metrics()) os << " " << k << "=" << fmt(v);
  out() << os.str() << "\n" << std::flush;
}

void ProgressBar::on_test_end(Trainer& trainer, LightningModule&) {
  if (!trainer.is_global_zero()) return;
  std::ostringstream os;
  os << "Test:";
  for (const auto& [k, v] : trainer.callback_metrics()) os << " " << k << "=" << fmt(v);
  out() << (terminal_ ? "\r" : "") << os.str() << "\n" << std::flush;
}

}  // namespace fulgur
