// SPDX-License-Identifier: Apache-2.0
#pragma once
// When a stop signal ends a loop: the batch boundary at which every rank stops.

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <utility>

namespace fulgur::detail {

// One process looks at its own flag at every batch boundary, which is free.
// Several processes must stop after the same batch, so they agree, and that
// costs a collective and a sync point, which at every batch is a measurable share
// of a small model's step (the 2-process CNN benchmark). They agree every `every()`
// boundaries, where `every()` follows the measured time per batch so that
// agreements fall about `target` apart: a signal is acted on within about
// `target` plus one batch, whatever a batch costs. The time measured is the
// maximum over ranks, reduced with the flag, so every rank computes the same
// `every()` and the ranks' calls to `agree` stay paired.
class StopPoll {
 public:
  using Clock = std::chrono::steady_clock;
  // agree(local flag, seconds since the last agreement) -> (the flag of any
  // rank, the largest of the seconds over ranks). Empty: one process.
  using Agree = std::function<std::pair<bool, double>(bool, double)>;
  static constexpr int64_t kMaxEvery = 256;

  StopPoll(Agree agree, std::chrono::duration<double> target, Clock::time_point start = Clock::now());

  // Called at each batch boundary, in the same order on every rank. `local`:
  // this process received a stop signal; `force`: agree now (a loop's last
  // batch). True when the loop stops here.
  bool poll(bool local, bool force, Clock::time_point now = Clock::now());

  int64_t every() const { return every_; }

 private:
  Agree agree_;
  double target_;
  int64_t every_ = 1;
  int64_t since_ = 0;
  Clock::time_point last_;
};

// A loop's poll at a batch boundary, with this process's received stop signal (runtime/signals.h)
// as the local flag: whether the loop stops here. False without a poll (signals not handled).
bool poll_stop_signal(std::optional<StopPoll>& poll, bool force);

}  // namespace fulgur::detail
