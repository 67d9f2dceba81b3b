// SPDX-License-Identifier: Apache-2.0
#include "runtime/log.h"

#include "launchers/worker_env.h"
#include "runtime/env.h"
#include "runtime/sha256.h"

#include <fulgur/plugins/environments/cluster_environment.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
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

// The detected environment's rank and world size, and the process they were detected in. The
// variables do not change within a process (a forked worker gets its own before it logs, and has
// another pid), so detection runs once per process, not once per message. Atomics, not a mutex:
// a fork may copy a mutex another thread holds; two threads that race detect the same values.
std::atomic<pid_t> detected_pid{-1};
std::atomic<int64_t> detected_rank{0};
std::atomic<int64_t> detected_world_size{1};

// This process's global rank and world size: a RankScope's while a stage runs, else the detected
// environment's.
std::pair<int64_t, int64_t> ranks() {
  const int64_t rank = scoped_rank.load();
  if (rank >= 0) return {rank, scoped_world_size.load()};
  const pid_t pid = ::getpid();
  if (detected_pid.load(std::memory_order_acquire) != pid) {
    const auto env = detect_cluster_environment();
    detected_rank.store(env->global_rank());
    detected_world_size.store(env->world_size());
    detected_pid.store(pid, std::memory_order_release);
  }
  return {detected_rank.load(), detected_world_size.load()};
}

// In a worker of fulgur's launcher: the folder where the messages shown once are recorded for
// the whole run of the launching process, "shown" beside the launches' own folders in its private
// folder (FULGUR_LAUNCH_DIR is <that folder>/launch-<i>); "" elsewhere. Every stage starts new
// workers, which remember nothing of the earlier stages' workers and hold only what the launching
// process had shown when it forked them; the record on disk is what they share. It goes with
// that folder when the launching process exits.
std::string shared_record_dir() {
  const std::string launch_dir = env_string(fulgur::detail::kLaunchDirEnv);
  if (launch_dir.empty() || env_string(fulgur::detail::kWorkerEnv) != "1") return "";
  const std::string dir = (std::filesystem::path(launch_dir).parent_path() / "shown").string();
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) return "";  // no record: once per process, as before
  return dir;
}

// Whether `message` is shown for the first time: in this process, and in a worker, in the whole
// run of its launching process too. A worker claims a message by creating the file named by its
// digest with O_EXCL, which exactly one process of all the ranks and stages manages.
bool first_time(const std::string& message) {
  static std::mutex mu;
  static std::unordered_set<std::string> seen;
  std::lock_guard<std::mutex> lock(mu);
  if (!seen.insert(message).second) return false;
  const std::string dir = shared_record_dir();
  if (dir.empty()) return true;
  const std::string path = dir + "/" + to_hex(sha256(message));
  const int fd = ::open(path.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0600);
  if (fd >= 0) {
    ::close(fd);
    return true;
  }
  return errno != EEXIST;  // the record cannot be written: show it rather than lose it
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

bool info_rank_zero_once(const std::string& message) {
  if (!log_enabled(LogLevel::kInfo) || ranks().first != 0 || !first_time(message)) return false;
  write_line("fulgur: " + message + "\n");
  return true;
}

bool warn_once(const std::string& message) {
  if (!log_enabled(LogLevel::kWarning) || !first_time(message)) return false;
  log(LogLevel::kWarning, "warning: " + message);
  return true;
}

}  // namespace fulgur::runtime
