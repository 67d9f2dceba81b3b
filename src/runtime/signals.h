#pragma once
// SIGTERM / SIGINT during fit: the handler only records the signal; the
// training loop stops at the next step boundary. Handlers are restored when
// the guard goes out of scope.

#include <csignal>

namespace fulgur::runtime {

class StopSignalGuard {
 public:
  StopSignalGuard();
  ~StopSignalGuard();
  StopSignalGuard(const StopSignalGuard&) = delete;
  StopSignalGuard& operator=(const StopSignalGuard&) = delete;
};

// The signal received since the guard was installed, or 0.
int received_stop_signal();
// Clears the recorded signal.
void clear_stop_signal();

}  // namespace fulgur::runtime
