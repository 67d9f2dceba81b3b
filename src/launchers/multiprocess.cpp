// SPDX-License-Identifier: Apache-2.0
// The multi-process launcher: each launch gets a private folder and runs attempts, each of which
// starts this node's workers (worker_start.h), supervises them and explains a failure
// (diagnose.h); a failed attempt is started again up to max_restarts times.

#include <fulgur/launchers/launcher.h>
#include <fulgur/plugins/io/checkpoint_io.h>

#include "launchers/diagnose.h"
#include "launchers/failure_store.h"
#include "launchers/restarts.h"
#include "launchers/worker_env.h"
#include "launchers/worker_start.h"
#include "runtime/env.h"
#include "runtime/log.h"
#include "runtime/signals.h"

#include <torch/serialize.h>
#include <torch/torch.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <sstream>
#include <thread>

namespace fs = std::filesystem;

namespace fulgur {
namespace {

using detail::kLaunchDirEnv;
using detail::kLaunchIndexEnv;
using detail::kRestartCountEnv;
using detail::kWorkerEnv;
using detail::ErrorRecord;
using detail::failure_elsewhere;
using detail::failure_time_now;
using detail::read_error_record;
using detail::report_failure_to_job;

// The folder holding this process's launches: private (0700, from mkdtemp),
// removed when the process that made it exits normally.
struct RunDir {
  RunDir() : owner(::getpid()) {
    const char* tmp = runtime::env_value("TMPDIR");
    std::string tpl = std::string(tmp ? tmp : "/tmp") + "/fulgur-XXXXXX";
    std::vector<char> buf(tpl.begin(), tpl.end());
    buf.push_back('\0');
    if (!::mkdtemp(buf.data())) throw std::runtime_error("launcher: cannot create a private folder from " + tpl);
    path = buf.data();
  }
  ~RunDir() {
    std::error_code ec;
    if (::getpid() == owner) fs::remove_all(path, ec);
  }
  std::string path;
  pid_t owner;
};

// A process forked from one that launched before (not a worker: a program's
// own fork) gets a folder of its own, or its launches would reuse the
// parent's rendezvous files.
const std::string& run_dir() {
  static std::unique_ptr<RunDir> dir;
  if (!dir || dir->owner != ::getpid()) dir = std::make_unique<RunDir>();
  return dir->path;
}

}  // namespace

bool is_fulgur_worker() {
  return runtime::env_string(kWorkerEnv) == "1";
}

MultiProcessLauncher::MultiProcessLauncher(MultiProcessLauncherOptions options) : options_(std::move(options)) {
  if (options_.start_method() != "fork" && options_.start_method() != "spawn") {
    throw std::invalid_argument("start_method '" + options_.start_method() + "' is not known; valid: \"fork\", \"spawn\"");
  }
  if (options_.num_processes() < 1) {
    throw std::invalid_argument("num_processes=" + std::to_string(options_.num_processes()) + " must be >= 1");
  }
  if (options_.max_restarts() < 0) {
    throw std::invalid_argument("max_restarts=" + std::to_string(options_.max_restarts()) +
                                " is negative; use 0 (a failure ends the job) or the number of restarts allowed");
  }
  // A spawned worker of fulgur's own launch makes this launcher again, with
  // processes_created_externally set, and only runs its part.
  if (options_.max_restarts() > 0 && options_.processes_created_externally() && !is_fulgur_worker()) {
    throw std::invalid_argument("max_restarts=" + std::to_string(options_.max_restarts()) +
                                ", but the processes were started outside fulgur (torchrun, srun or by hand), which "
                                "fulgur cannot start again; give the restarts to that launcher (torchrun "
                                "--max-restarts) and max_restarts=0 here");
  }
}

namespace {

// One attempt of launch `index`: starts this node's workers with `env`,
// supervises them until every one has exited (the first failure stops the
// others), and explains a failure. Throws only when a worker cannot be
// started (after killing the ones that were).
detail::FailureReport run_attempt(const MultiProcessLauncherOptions& options, const WorkerFn& fn,
                       const std::map<std::string, std::string>& env, const std::string& dir, int64_t index,
                       int64_t attempt) {
  const int64_t n = options.num_processes();
  const bool several_nodes = options.num_nodes() > 1;
  const std::string keys = detail::launch_store_prefix(index, attempt);
  const std::vector<pid_t> pids = detail::start_workers(options, fn, env, index, keys);

  // Supervise: the first failure stops the others. The guard is installed
  // after the forks: a forked worker would inherit it as already installed,
  // and its own guard (run_in_worker) would then not install its handlers.
  runtime::StopSignalGuard signals;
  struct Exit {
    bool done = false;
    int status = 0;
    double time = 0;
  };
  std::vector<Exit> exits(n);
  int64_t alive = n;
  bool forwarded = false;
  bool hurried = false;
  int forwarded_signal = 0;
  bool killed_after_signal = false;  // SIGKILL sent to workers a stop signal did not end
  bool stopping = false;
  double stop_time = 0;  // when the parent began stopping the others
  auto stop_deadline = std::chrono::steady_clock::time_point::max();
  auto next_poll = std::chrono::steady_clock::now();
  while (alive > 0) {
    // Another node's failure stops this node's workers too.
    if (several_nodes && !stopping && !forwarded && std::chrono::steady_clock::now() >= next_poll) {
      if (!failure_elsewhere(options, keys, std::chrono::milliseconds(1000)).empty()) {
        stopping = true;
        stop_time = failure_time_now();
        for (int64_t j = 0; j < n; ++j)
          if (!exits[j].done) ::kill(pids[j], SIGTERM);
        stop_deadline = std::chrono::steady_clock::now() + options.grace_period();
      }
      next_poll = std::chrono::steady_clock::now() + std::chrono::milliseconds(500);
    }
    if (!forwarded && runtime::received_stop_signal() != 0) {
      forwarded = true;
      forwarded_signal = runtime::received_stop_signal();
      for (int64_t i = 0; i < n; ++i)
        if (!exits[i].done) ::kill(pids[i], forwarded_signal);
      stop_deadline = std::min(stop_deadline, std::chrono::steady_clock::now() + options.stop_timeout());
    }
    if (forwarded && !hurried && runtime::stop_signal_count() > 1) {
      hurried = true;  // asked twice: SIGKILL now
      stop_deadline = std::chrono::steady_clock::now();
    }
    bool progressed = false;
    for (int64_t i = 0; i < n; ++i) {
      if (exits[i].done) continue;
      int status = 0;
      const pid_t r = ::waitpid(pids[i], &status, WNOHANG);
      if (r != pids[i]) continue;
      exits[i] = {true, status, failure_time_now()};
      --alive;
      progressed = true;
      const bool failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
      if (failed && !stopping && !forwarded) {
        if (several_nodes) {
          const int64_t rank = options.node_rank() * n + i;
          const ErrorRecord rec = read_error_record(dir, rank);
          const std::string what =
              "worker rank " + std::to_string(rank) + " " +
              detail::how_it_ended(detail::WorkerExit::from_wait_status(rank, status, exits[i].time), rec);
          // A collective error here is the consequence of a failure elsewhere, which that node reports.
          if (!(rec.present && rec.kind == "collective")) report_failure_to_job(options, keys, what);
        }
        stopping = true;
        stop_time = failure_time_now();
        for (int64_t j = 0; j < n; ++j)
          if (!exits[j].done) ::kill(pids[j], SIGTERM);
        stop_deadline = std::chrono::steady_clock::now() + options.grace_period();
      }
    }
    if (alive > 0 && std::chrono::steady_clock::now() >= stop_deadline) {
      killed_after_signal = forwarded;
      for (int64_t j = 0; j < n; ++j)
        if (!exits[j].done) ::kill(pids[j], SIGKILL);
      stop_deadline = std::chrono::steady_clock::time_point::max();
    }
    if (!progressed) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  runtime::clear_stop_signal();

  std::vector<detail::WorkerExit> worker_exits;
  std::map<int64_t, ErrorRecord> records;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t rank = options.node_rank() * n + i;
    worker_exits.push_back(detail::WorkerExit::from_wait_status(rank, exits[i].status, exits[i].time));
    if (!worker_exits.back().ok()) records[rank] = read_error_record(dir, rank);
  }
  detail::SupervisionLog log;
  log.stopped_for_failure = stopping;
  log.stop_time = stop_time;
  log.forwarded_signal = forwarded ? forwarded_signal : 0;
  log.killed_after_signal = killed_after_signal;
  log.hurried = hurried;
  detail::JobView job;
  job.node_rank = options.node_rank();
  job.several_nodes = several_nodes;
  job.stop_timeout_ms = options.stop_timeout().count();
  job.failure_elsewhere = [&] { return failure_elsewhere(options, keys); };
  return detail::diagnose(worker_exits, records, log, job);
}

// In a spawned worker: replays the launches its parent made before this one
// (their results are in the launch folders), then runs its part of this one.
c10::IValue run_spawned_worker(const MultiProcessLauncherOptions& options, const WorkerFn& fn) {
  const int64_t index = runtime::env_int(kLaunchIndexEnv, -1);
  if (index < 0) throw std::runtime_error(std::string("a spawned fulgur worker needs ") + kLaunchIndexEnv + ", which is not set");
  const int64_t mine = detail::launch_count()++;
  if (mine < index) {
    if (options.num_nodes() > 1 && options.node_rank() != 0) return c10::IValue();  // as the parent got
    const std::string earlier = fs::path(runtime::env_required(kLaunchDirEnv, "a spawned fulgur worker")).parent_path() / ("launch-" + std::to_string(mine)) / "result.pt";
    return TorchCheckpointIO().load_checkpoint(earlier).at("result");
  }
  detail::run_worker(fn);
}

// Empties a launch's folder for its next attempt (error records, the file
// store, a result), keeping only the record of the checkpoint folders that
// the restarted workers resume from.
void clear_for_restart(const std::string& dir) {
  std::error_code ec;
  std::vector<fs::path> stale;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.path().filename() != detail::kCheckpointFoldersFile) stale.push_back(e.path());
  }
  for (const auto& p : stale) fs::remove_all(p, ec);
}

// The report of a launch that failed after restarts: each attempt's root cause.
std::string attempts_report(const std::vector<std::string>& reports, bool interrupted, int64_t max_restarts) {
  if (reports.size() == 1) return reports.front();
  std::ostringstream out;
  if (interrupted) {
    out << reports.back() << "\nafter " << reports.size() - 1 << " restart(s), of these failed attempts:";
  } else {
    out << "the job failed on each of its " << reports.size() << " attempts (max_restarts=" << max_restarts << "):";
  }
  const size_t listed = interrupted ? reports.size() - 1 : reports.size();
  for (size_t i = 0; i < listed; ++i) out << "\n  attempt " << i + 1 << ": " << reports[i];
  return out.str();
}

}  // namespace

c10::IValue MultiProcessLauncher::launch(const WorkerFn& fn) {
  if (is_fulgur_worker()) return run_spawned_worker(options_, fn);
  if (options_.processes_created_externally()) return fn();  // torchrun, srun, ...

  const int64_t index = detail::launch_count()++;
  const std::string dir = run_dir() + "/launch-" + std::to_string(index);
  fs::create_directories(dir);
  std::map<std::string, std::string> env = detail::worker_environment(options_, dir, index);
  if (options_.num_nodes() > 1) detail::serve_node_store(options_);  // before any worker needs it

  // A failed attempt is started again, up to max_restarts times, once every
  // worker of it has exited; a fit resumes from the run's last.ckpt
  // (TrainerImpl::run_in_worker, launchers/restarts.h).
  std::vector<std::string> reports;
  for (int64_t attempt = 0;; ++attempt) {
    if (attempt > 0) clear_for_restart(dir);
    env[kRestartCountEnv] = std::to_string(attempt);
    const detail::FailureReport end = run_attempt(options_, fn, env, dir, index, attempt);
    if (end.ok) {
      if (options_.node_rank() != 0) return c10::IValue();
      return TorchCheckpointIO().load_checkpoint(dir + "/result.pt").at("result");
    }
    reports.push_back(end.report);
    if (end.interrupted || attempt >= options_.max_restarts()) {
      throw WorkerFailure(attempts_report(reports, end.interrupted, options_.max_restarts()), end.rank, end.exit_code);
    }
    runtime::log(runtime::LogLevel::kWarning,
                 "attempt " + std::to_string(attempt + 1) + " of " + std::to_string(options_.max_restarts() + 1) +
                     " failed: " + end.report + "; every worker has stopped; starting them again (restart " +
                     std::to_string(attempt + 1) + " of " + std::to_string(options_.max_restarts()) +
                     "; a fit resumes from its last.ckpt)");
  }
}

}  // namespace fulgur
