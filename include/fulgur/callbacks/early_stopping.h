// SPDX-License-Identifier: Apache-2.0
#pragma once
// EarlyStopping: stops fit when a monitored metric stops improving.

#include <fulgur/callbacks/callback.h>

#include <torch/arg.h>

#include <limits>
#include <optional>
#include <string>

namespace fulgur {

struct EarlyStoppingOptions {
  explicit EarlyStoppingOptions(std::string monitor) : monitor_(std::move(monitor)) {}
  TORCH_ARG(std::string, monitor);
  // Smallest change that counts as an improvement.
  TORCH_ARG(double, min_delta) = 0.0;
  // Checks without improvement before stopping.
  TORCH_ARG(int64_t, patience) = 3;
  // "min" or "max".
  TORCH_ARG(std::string, mode) = "min";
  // Throw when the monitored metric was never logged (else warn and skip).
  TORCH_ARG(bool, strict) = true;
  // Stop when the metric becomes NaN or infinite.
  TORCH_ARG(bool, check_finite) = true;
  // Stop as soon as the metric is better than this.
  TORCH_ARG(std::optional<double>, stopping_threshold) = std::nullopt;
  // Stop as soon as the metric is worse than this.
  TORCH_ARG(std::optional<double>, divergence_threshold) = std::nullopt;
};

class EarlyStopping : public Callback {
 public:
  explicit EarlyStopping(EarlyStoppingOptions options);
  std::string state_key() const override;
  void on_train_epoch_end(Trainer&, LightningModule&) override;
  void on_validation_end(Trainer&, LightningModule&) override;
  c10::IValue state_dict() const override;
  void load_state_dict(const c10::IValue& state) override;

  const EarlyStoppingOptions& options() const { return options_; }
  int64_t wait_count() const { return wait_count_; }
  int64_t stopped_epoch() const { return stopped_epoch_; }
  double best_score() const { return best_score_; }
  // Why the last check stopped the run (empty if it did not).
  const std::string& reason() const { return reason_; }

 private:
  void check(Trainer& trainer);
  EarlyStoppingOptions options_;
  double best_score_;
  int64_t wait_count_ = 0;
  int64_t stopped_epoch_ = 0;
  std::string reason_;
  bool saw_validation_ = false;
};

}  // namespace fulgur
