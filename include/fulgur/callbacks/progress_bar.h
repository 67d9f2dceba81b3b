// SPDX-License-Identifier: Apache-2.0
#pragma once
// ProgressBar: one line of progress. On a terminal it redraws that line in
// place; elsewhere (CI logs, files) it prints a plain line now and then.
// Only global rank 0 prints.

#include <fulgur/callbacks/callback.h>

#include <torch/arg.h>

#include <chrono>
#include <iosfwd>
#include <optional>

namespace fulgur {

// Example:
//   fulgur::ProgressBar(fulgur::ProgressBarOptions().stream(&std::cerr).print_every(50))
struct ProgressBarOptions {
  // A name for the pointer type: TORCH_ARG spells its setter `const T&`,
  // which for `std::ostream*` would be a pointer to const.
  using Stream = std::ostream*;
  // Where to print; default (nullptr) std::cout.
  TORCH_ARG(Stream, stream) = nullptr;
  // Redraw in place; default: whether stdout is a terminal.
  TORCH_ARG(std::optional<bool>, terminal) = std::nullopt;
  // Print every this many batches. Default: on a terminal, redraw at most
  // every 100 ms; elsewhere, about 10 lines an epoch.
  TORCH_ARG(int64_t, print_every) = 0;
};

class ProgressBar : public Callback {
 public:
  explicit ProgressBar(ProgressBarOptions options = {});
  std::string state_key() const override { return "ProgressBar"; }
  void on_train_epoch_start(Trainer&, LightningModule&) override;
  void on_train_batch_end(Trainer&, LightningModule&, const StepOutput&, const Batch&, int64_t) override;
  void on_train_epoch_end(Trainer&, LightningModule&) override;
  void on_validation_end(Trainer&, LightningModule&) override;
  void on_test_end(Trainer&, LightningModule&) override;

  // The text of the line for the given state, as printed (without \r or \n).
  std::string render(Trainer& trainer, int64_t batch_idx, int64_t total) const;

 private:
  std::ostream& out() const;
  ProgressBarOptions options_;
  bool terminal_;
  std::chrono::steady_clock::time_point epoch_start_;
  std::chrono::steady_clock::time_point last_draw_;
  int64_t batches_seen_ = 0;
  int64_t epoch_total_ = 0;  // batches this epoch will run (max_steps included)
};

}  // namespace fulgur
