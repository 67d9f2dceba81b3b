// SPDX-License-Identifier: Apache-2.0
// The multi-process launcher: each launch gets a private folder and runs attempts, each of which
// starts this node's workers (worker_start.h), supervises them (supervisor.h) and explains a
// failure (diagnose.h); a failed attempt is started again up to max_restarts times.

#include <fulgur/launchers/launcher.h>
#include <fulgur/plugins/io/checkpoint_io.h>

#include "launchers/diagnose.h"
#include "launchers/failure_store.h"
#include "launchers/restarts.h"
#include "launchers/supervisor.h"
#include "launchers/worker_env.h"
#include "launchers/worker_start.h"
#include "runtime/env.h"
#include "runtime/log.h"
#include "runtime/signals.h"

#include <torch/serialize.h>
#include <torch/torch.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <sstream>

namespace fs = std::filesystem;

namespace fulgur {
namespace {

using detail::kLaunchDirEnv;
using detail::kLaunchIndexEnv;
using detail::kRestartCountEnv;
using detail::kWorkerEnv;

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
                                  const std::map<std::string, std::string>& env, const std::string& dir,
                                  int64_t index, int64_t attempt) {
  const std::string keys = detail::launch_store_prefix(index, attempt);
  const std::vector<pid_t> pids = detail::start_workers(options, fn, env, index, keys);
  // Installed after the forks (see supervise), and held until the attempt is explained.
  runtime::StopSignalGuard signals;
  const detail::Supervised run = detail::supervise(options, pids, dir, keys);
  std::map<int64_t, detail::ErrorRecord> records;
  for (const detail::WorkerExit& e : run.exits) {
    if (!e.ok()) records[e.rank] = detail::read_error_record(dir, e.rank);
  }
  detail::JobView job;
  job.node_rank = options.node_rank();
  job.several_nodes = options.num_nodes() > 1;
  job.stop_timeout_ms = options.stop_timeout().count();
  job.failure_elsewhere = [&] { return detail::failure_elsewhere(options, keys); };
  return detail::diagnose(run.exits, records, run.log, job);
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
