// SPDX-License-Identifier: Apache-2.0
#pragma once
// SIGTERM / SIGINT during fit: the handler only records the signal; the
// training loop stops at the next batch boundary it agrees on with the other
// ranks. Handlers are restored when the outermost guard goes out of scope.

#include <csignal>
#include <string>

namespace fulgur::runtime {

// What a second stop signal does while a guard is installed.
enum class SecondSignal {
  kRecorded,  // counted only (a worker: its launcher decides, and a terminal's
              // Ctrl-C reaches it both directly and forwarded by the launcher)
  kExits,     // ends the process at once with 128 + signal (a process on its
              // own: the user asked twice)
};

class StopSignalGuard {
 public:
  explicit StopSignalGuard(SecondSignal second = SecondSignal::kRecorded);
  ~StopSignalGuard();
  StopSignalGuard(const StopSignalGuard&) = delete;
  StopSignalGuard& operator=(const StopSignalGuard&) = delete;
};

// The first signal received since the guard was installed, or 0.
int received_stop_signal();

// "SIGKILL", "SIGTERM", ..., or "signal <n>" for one without a name here.
std::string signal_name(int sig);
// How many stop signals arrived since the guard was installed.
int stop_signal_count();
// Clears the recorded signal and the count.
void clear_stop_signal();

}  // namespace fulgur::runtime
