// SPDX-License-Identifier: Apache-2.0
#include "runtime/log.h"

#include "runtime/env.h"

#include <fulgur/plugins/environments/cluster_environment.h>

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <unordered_set>
#include <utility>

namespace fulgur::runtime {
namespace {

// The lowest level written; -1: none ("off"); -2: a value that is not known.
int threshold(const std::string& s) {
  if (s.empty() || s == "info") return static_cast<int>(LogLevel::kInfo);
  if (s == "debug") return static_cast<int>(LogLevel::kDebug);
  if (s == "warning") return static_cast<int>(LogLevel::kWarning);
  if (s == "error") return static_cast<int>(LogLevel::kError);
  if (s == "off") return -1;
  return -2;
}

std::string level_setting() { return env_string("FULGUR_LOG_LEVEL"); }

// The whole line in one write(2) (looping only if the kernel takes part of it).
void write_line(const std::string& line) {
  const char* p = line.data();
  size_t left = line.size();
  while (left > 0) {
    const ssize_t n = ::write(STDERR_FILENO, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // stderr is closed or full: the message is lost, the run goes on
    p += n;
    left -= static_cast<size_t>(n);
  }
}

// The rank and world size a RankScope set; -1: none is set.
std::atomic<int64_t> scoped_rank{-1};
std::atomic<int64_t> scoped_world_size{-1};

// This process's global rank and world size.
std::pair<int64_t, int64_t> ranks() {
  const int64_t rank = scoped_rank.load();
  if (rank >= 0) return {rank, scoped_world_size.load()};
  const auto env = detect_cluster_environment();
  return {env->global_rank(), env->world_size()};
}

// Whether `message` is asked for the first time in this process (warn_once's record).
bool first_time(const std::string& message) {
  static std::mutex mu;
  static std::unordered_set<std::string> seen;
  std::lock_guard<std::mutex> lock(mu);
  return seen.insert(message).second;
}

}  // namespace

RankScope::RankScope(int64_t global_rank, int64_t world_size)
    : previous_rank_(scoped_rank.exchange(global_rank)), previous_world_size_(scoped_world_size.exchange(world_size)) {}

RankScope::~RankScope() {
  scoped_rank.store(previous_rank_);
  scoped_world_size.store(previous_world_size_);
}

bool log_enabled(LogLevel level) {
  int lowest = threshold(level_setting());
  if (lowest == -2) lowest = static_cast<int>(LogLevel::kInfo);  // refused by validate_environment at Trainer construction
  return lowest >= 0 && static_cast<int>(level) >= lowest;
}

void log(LogLevel level, const std::string& message) {
  if (!log_enabled(level)) return;
  const auto [global_rank, world_size] = ranks();
  const std::string rank = world_size > 1 ? "rank " + std::to_string(global_rank) + ": " : "";
  write_line("fulgur: " + rank + message + "\n");
}

int64_t global_rank() { return ranks().first; }

void log_rank_zero(LogLevel level, const std::string& message) {
  if (!log_enabled(level) || ranks().first != 0) return;
  write_line("fulgur: " + message + "\n");
}


bool warn_rank_zero_once(const std::string& message) {
  if (!log_enabled(LogLevel::kWarning) || ranks().first != 0 || !first_time(message)) return false;
  write_line("fulgur: warning: " + message + "\n");
  return true;
}

bool warn_once(const std::string& message) {
  if (!log_enabled(LogLevel::kWarning) || !first_time(message)) return false;
  log(LogLevel::kWarning, "warning: " + message);
  return true;
}

}  // namespace fulgur::runtime
