// SPDX-License-Identifier: Apache-2.0
#pragma once
// Timer: measures the time each stage takes and stops fit once training has
// run for a given duration (Lightning's Timer). The training time is kept in
// checkpoints, so a resumed fit counts the time of the runs before it.
//
// Example:
//   // At most 12 hours of training, checked after every optimizer step.
//   auto timer = std::make_shared<fulgur::Timer>(fulgur::TimerOptions().duration("00:12:00:00"));
//   fulgur::Trainer trainer(fulgur::TrainerOptions().callbacks({timer}));
//   trainer.fit(model, datamodule);
//   double seconds = timer->time_elapsed("train");

#include <fulgur/callbacks/callback.h>

#include <torch/arg.h>

#include <chrono>
#include <map>
#include <optional>
#include <string>

namespace fulgur {

struct TimerOptions {
  // The duration below as Lightning's string: "DD:HH:MM:SS" (days of any number
  // of digits, the rest two digits each). Another form throws std::invalid_argument naming it.
  TimerOptions& duration(const std::string& dd_hh_mm_ss);
  // How long training may run; unset: no limit (the Timer only measures).
  TORCH_ARG(std::optional<std::chrono::duration<double>>, duration) = std::nullopt;
  // When the time is checked: after every batch ("step") or at each epoch end ("epoch").
  TORCH_ARG(std::string, interval) = "step";
  // Rank 0 says when the time is up.
  TORCH_ARG(bool, verbose) = true;
};

class Timer : public Callback {
 public:
  // Throws std::invalid_argument for an interval other than "step" or "epoch",
  // or a negative duration.
  explicit Timer(TimerOptions options = TimerOptions());
  std::string state_key() const override { return "Timer"; }

  // Seconds the stage ran: "train" (fit's training loop, with the time of the
  // runs a resumed fit continues), "validate" (the last validation run, fit's
  // own included), "test" or "predict". Still running: up to now. Another
  // name throws std::invalid_argument listing the known ones.
  double time_elapsed(const std::string& stage = "train") const;
  // duration minus time_elapsed(stage); unset without a duration.
  std::optional<double> time_remaining(const std::string& stage = "train") const;
  // Why the Timer stopped fit ("" while it has not).
  const std::string& reason() const { return reason_; }
  const TimerOptions& options() const { return options_; }

  void on_fit_start(Trainer&, LightningModule&) override;
  void on_train_start(Trainer&, LightningModule&) override;
  void on_train_end(Trainer&, LightningModule&) override;
  void on_train_batch_end(Trainer&, LightningModule&, const StepOutput&, const Batch&, int64_t) override;
  void on_train_epoch_end(Trainer&, LightningModule&) override;
  void on_validation_epoch_start(Trainer&, LightningModule&) override;
  void on_validation_epoch_end(Trainer&, LightningModule&) override;
  void on_test_start(Trainer&, LightningModule&) override;
  void on_test_end(Trainer&, LightningModule&) override;
  void on_predict_start(Trainer&, LightningModule&) override;
  void on_predict_end(Trainer&, LightningModule&) override;
  // {"time_elapsed": {stage: seconds}}, Lightning's layout; a resumed fit reads "train".
  c10::IValue state_dict() const override;
  void load_state_dict(const c10::IValue& state) override;

 private:
  using Clock = std::chrono::steady_clock;
  struct Span {
    std::optional<Clock::time_point> start, end;
  };
  void check_time_remaining(Trainer& trainer);
  const Span& span(const std::string& stage) const;
  TimerOptions options_;
  std::map<std::string, Span> spans_;
  // Training seconds of the runs before a resume.
  double offset_ = 0.0;
  std::string reason_;
};

}  // namespace fulgur
