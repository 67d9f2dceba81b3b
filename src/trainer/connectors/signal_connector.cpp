// SPDX-License-Identifier: Apache-2.0
// The stop signals of a fit: the handlers and the stop polls.

#include "trainer/connectors/signal_connector.h"

#include <fulgur/launchers/launcher.h>
#include <fulgur/strategies/strategy.h>

#include "trainer/trainer_impl.h"

#include <torch/torch.h>

#include <chrono>

namespace fulgur::detail {

void SignalConnector::install(TrainerImpl& trainer) {
  if (!trainer.options.handle_signals()) return;
  guard_.emplace(is_fulgur_worker() ? runtime::SecondSignal::kRecorded : runtime::SecondSignal::kExits);
  Strategy& strategy = *trainer.strategy;
  StopPoll::Agree agree;
  if (strategy.world_size() > 1) {
    agree = [&strategy](bool local, double seconds) {
      const at::Tensor t = strategy.reduce(torch::tensor({local ? 1.0 : 0.0, seconds}, torch::kFloat64), "max");
      return std::make_pair(t[0].item<double>() > 0, t[1].item<double>());
    };
  }
  // Agreements about a quarter of a second apart: a signal is acted on
  // well within a second unless one batch takes longer than that.
  constexpr std::chrono::milliseconds kStopAgreeEvery{250};
  trainer.fit_loop.reset(StopPoll(agree, kStopAgreeEvery));
  trainer.evaluation_loop.reset(StopPoll(agree, kStopAgreeEvery));
}

}  // namespace fulgur::detail
