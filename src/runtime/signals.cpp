#include "runtime/signals.h"

#include <atomic>

namespace fulgur::runtime {
namespace {

std::atomic<int> g_signal{0};
struct sigaction g_old_term;
struct sigaction g_old_int;
int g_depth = 0;

void on_signal(int sig) {
  int expected = 0;
  g_signal.compare_exchange_strong(expected, sig);
}

}  // namespace

StopSignalGuard::StopSignalGuard() {
  if (g_depth++ > 0) return;
  g_signal.store(0);
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
}

int received_stop_signal() { return g_signal.load(); }

void clear_stop_signal() { g_signal.store(0); }

}  // namespace fulgur::runtime
