// SPDX-License-Identifier: Apache-2.0
#include "runtime/signals.h"

#include <unistd.h>

#include <atomic>

namespace fulgur::runtime {
namespace {

std::atomic<int> g_signal{0};
std::atomic<int> g_count{0};
std::atomic<bool> g_second_exits{false};
struct sigaction g_old_term;
struct sigaction g_old_int;
int g_depth = 0;

void on_signal(int sig) {
  int expected = 0;
  g_signal.compare_exchange_strong(expected, sig);
  if (g_count.fetch_add(1) >= 1 && g_second_exits.load()) {
    // Only async-signal-safe calls here.
    static const char kMessage[] = "fulgur: second stop signal: exiting now; the last saved checkpoint is kept\n";
    const ssize_t ignored = ::write(STDERR_FILENO, kMessage, sizeof(kMessage) - 1);
    (void)ignored;
    ::_exit(128 + sig);
  }
}

}  // namespace

StopSignalGuard::StopSignalGuard(SecondSignal second) {
  if (g_depth++ > 0) return;
  g_signal.store(0);
  g_count.store(0);
  g_second_exits.store(second == SecondSignal::kExits);
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, &g_old_term);
  sigaction(SIGINT, &sa, &g_old_int);
}

StopSignalGuard::~StopSignalGuard() {
  if (--g_depth > 0) return;
  sigaction(SIGTERM, &g_old_term, nullptr);
  sigaction(SIGINT, &g_old_int, nullptr);
  g_second_exits.store(false);
}

int received_stop_signal() { return g_signal.load(); }

int stop_signal_count() { return g_count.load(); }

void clear_stop_signal() {
  g_signal.store(0);
  g_count.store(0);
}

std::string signal_name(int sig) {
  switch (sig) {
    case SIGKILL: return "SIGKILL";
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGSEGV: return "SIGSEGV";
    case SIGABRT: return "SIGABRT";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGILL: return "SIGILL";
    case SIGHUP: return "SIGHUP";
    case SIGPIPE: return "SIGPIPE";
  }
  return "signal " + std::to_string(sig);
}

}  // namespace fulgur::runtime
