// SPDX-License-Identifier: Apache-2.0
#pragma once
// The stop signals of a fit (Lightning's trainer/connectors/signal_connector.py): SIGTERM and
// SIGINT handlers for the stage, and the polls where the fit loop and its evaluations agree to
// stop (stop_poll.h).

#include "runtime/signals.h"

#include <optional>

namespace fulgur::detail {

struct TrainerImpl;

class SignalConnector {
 public:
  // With handle_signals: installs the handlers, which stay until this object goes (the end of
  // the stage), and gives `trainer`'s fit and evaluation loops their polls; without it, nothing.
  // Called once the rendezvous and the restore are done, as Lightning registers its handlers:
  // until then SIGTERM and SIGINT keep their default action and end the worker at once,
  // wherever it waits. Every rank calls.
  void install(TrainerImpl& trainer);

 private:
  std::optional<runtime::StopSignalGuard> guard_;
};

}  // namespace fulgur::detail
