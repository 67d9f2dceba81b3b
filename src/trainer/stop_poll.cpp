// SPDX-License-Identifier: Apache-2.0
#include "trainer/stop_poll.h"

#include "runtime/signals.h"

#include <algorithm>
#include <cmath>

namespace fulgur::detail {

StopPoll::StopPoll(Agree agree, std::chrono::duration<double> target, Clock::time_point start)
    : agree_(std::move(agree)), target_(target.count()), last_(start) {}

bool StopPoll::poll(bool local, bool force, Clock::time_point now) {
  if (!agree_) return local;
  ++since_;
  if (!force && since_ < every_) return false;
  const auto [stop, seconds] = agree_(local, std::chrono::duration<double>(now - last_).count());
  const double per_batch = seconds / static_cast<double>(since_);
  const double fit = per_batch > 0 ? std::floor(target_ / per_batch) : static_cast<double>(kMaxEvery);
  every_ = static_cast<int64_t>(std::clamp(fit, 1.0, static_cast<double>(kMaxEvery)));
  since_ = 0;
  last_ = now;
  return stop;
}

bool poll_stop_signal(std::optional<StopPoll>& poll, bool force) {
  return poll && poll->poll(runtime::received_stop_signal() != 0, force);
}

}  // namespace fulgur::detail
