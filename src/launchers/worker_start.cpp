// SPDX-License-Identifier: Apache-2.0
#include "launchers/worker_start.h"

#include <fulgur/distributed/collectives.h>
#include <fulgur/plugins/environments/cluster_environment.h>
#include <fulgur/plugins/io/checkpoint_io.h>

#include "launchers/failure_store.h"
#include "launchers/worker_env.h"
#include "launchers/worker_fork.h"
#include "runtime/env.h"
#include "runtime/log.h"
#include "runtime/threads.h"

#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <stdexcept>

namespace fulgur::detail {
namespace {

int g_launches = 0;

pid_t plain_fork(int64_t) { return ::fork(); }

WorkerForkFn g_worker_fork = plain_fork;

// A fork failed part way through starting a launch's workers: the ones
// already started would wait at the rendezvous for the missing ones until its
// timeout. They have done nothing worth a grace period, so they are
// SIGKILLed, and reaped so that no zombie is left either.
void kill_and_reap(const std::vector<pid_t>& started) {
  for (const pid_t pid : started) ::kill(pid, SIGKILL);
  for (const pid_t pid : started) {
    while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
    }
  }
}

std::vector<std::string> own_argv() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::vector<std::string> out;
  std::string arg;
  while (std::getline(in, arg, '\0')) out.push_back(arg);
  return out;
}

[[noreturn]] void worker_exit(int code) {
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  ::_exit(code);
}

// A forked worker runs on a fresh thread, not on the forked main thread.
// GNU OpenMP keeps a thread pool per master thread, and the child inherits the
// parent's pool without its threads: if the launching process ran a parallel
// region before fit, the forked main thread's first parallel region waits
// for them forever. A new thread starts a pool of its own.
[[noreturn]] void run_forked_worker(const WorkerFn& fn, int64_t local_world_size) {
  struct Job {
    const WorkerFn* fn;
    int64_t local_world_size;
  } job{&fn, local_world_size};
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, size_t{64} << 20);  // user code may recurse deeply
  pthread_t thread;
  auto body = [](void* arg) -> void* {
    auto* j = static_cast<Job*>(arg);
    runtime::apply_thread_policy(j->local_world_size);
    run_worker(*j->fn);  // exits the process
  };
  const int err = pthread_create(&thread, &attr, body, &job);
  pthread_attr_destroy(&attr);
  if (err != 0) {
    runtime::log(runtime::LogLevel::kWarning, std::string("cannot start the worker thread (") + std::strerror(err) +
                                                  "); running on the main thread");
    runtime::apply_thread_policy(local_world_size);
    run_worker(fn);
  }
  pthread_join(thread, nullptr);
  worker_exit(1);  // not reached: run_worker exits
}

// In the child just forked as worker `rank` (local rank `local`) of launch `index`: dies with
// the parent, takes the worker's environment, and runs `fn` (fork) or the program again (spawn).
[[noreturn]] void become_worker(const MultiProcessLauncherOptions& options, const WorkerFn& fn,
                                const std::map<std::string, std::string>& env, const std::vector<std::string>& argv,
                                int64_t index, int64_t rank, int64_t local, pid_t parent) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) ::_exit(1);
  ::signal(SIGTERM, SIG_DFL);
  ::signal(SIGINT, SIG_DFL);
  for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
  ::setenv("RANK", std::to_string(rank).c_str(), 1);
  ::setenv("LOCAL_RANK", std::to_string(local).c_str(), 1);
  if (options.start_method() == "spawn") {
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execv("/proc/self/exe", args.data());
    std::fprintf(stderr, "fulgur: rank %lld: cannot re-execute the program: %s\n", static_cast<long long>(rank),
                 std::strerror(errno));
    ::_exit(127);
  }
  g_launches = static_cast<int>(index);
  run_forked_worker(fn, options.num_processes());
}

}  // namespace

WorkerForkFn set_worker_fork(WorkerForkFn fn) {
  WorkerForkFn previous = g_worker_fork == plain_fork ? nullptr : g_worker_fork;
  g_worker_fork = fn ? fn : plain_fork;
  return previous;
}

int& launch_count() { return g_launches; }

std::map<std::string, std::string> worker_environment(const MultiProcessLauncherOptions& options,
                                                      const std::string& dir, int64_t index) {
  const int64_t n = options.num_processes();
  std::map<std::string, std::string> env = runtime::thread_environment(n);
  env[kWorkerEnv] = "1";
  env[kLaunchDirEnv] = dir;
  env[kLaunchIndexEnv] = std::to_string(index);
  env["WORLD_SIZE"] = std::to_string(n * options.num_nodes());
  env["LOCAL_WORLD_SIZE"] = std::to_string(n);
  env["NODE_RANK"] = std::to_string(options.node_rank());
  env["NUM_NODES"] = std::to_string(options.num_nodes());
  env["MASTER_ADDR"] = options.main_address();
  env["MASTER_PORT"] = std::to_string(options.main_port());
  if (options.num_nodes() > 1) {
    env[kParentStoreEnv] = "1";
  } else {
    env[kStoreEnv] = dir + "/store";
  }
  return env;
}

std::vector<pid_t> start_workers(const MultiProcessLauncherOptions& options, const WorkerFn& fn,
                                 const std::map<std::string, std::string>& env, int64_t index,
                                 const std::string& keys) {
  const int64_t n = options.num_processes();
  const std::vector<std::string> argv = options.start_method() == "spawn" ? own_argv() : std::vector<std::string>{};
  const pid_t parent = ::getpid();
  std::vector<pid_t> pids(n, -1);
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  for (int64_t local = 0; local < n; ++local) {
    const int64_t rank = options.node_rank() * n + local;
    const pid_t pid = g_worker_fork(local);
    if (pid < 0) {
      const int err = errno;
      const std::vector<pid_t> started(pids.begin(), pids.begin() + local);
      kill_and_reap(started);
      const std::string what = "cannot start worker rank " + std::to_string(rank) + " (local rank " +
                               std::to_string(local) + " of " + std::to_string(n) + "): fork failed: " +
                               std::strerror(err) + "; the " + std::to_string(local) +
                               " worker(s) already started were killed";
      if (options.num_nodes() > 1) report_failure_to_job(options, keys, "launcher " + what);
      throw std::runtime_error("launcher: " + what);
    }
    if (pid == 0) become_worker(options, fn, env, argv, index, rank, local, parent);
    pids[local] = pid;
  }
  return pids;
}

void run_worker(const WorkerFn& fn) {
  const std::string dir = runtime::env_required(kLaunchDirEnv, "a fulgur worker");
  const int64_t rank = LightningEnvironment().global_rank();
  try {
    c10::IValue result = fn();
    if (rank == 0) {
      Checkpoint wrapped = make_dict();
      wrapped.insert("result", result);
      TorchCheckpointIO().save_checkpoint(wrapped, dir + "/result.pt");
    }
    worker_exit(0);
  } catch (const WorkerFailure& e) {
    write_error_record(dir, rank, "interrupted", e.what());
    worker_exit(e.exit_code());
  } catch (const CollectiveError& e) {
    // Usually the consequence of another rank's failure.
    write_error_record(dir, rank, "collective", e.what());
    runtime::log(runtime::LogLevel::kError, "failed: " + std::string(e.what()));
    worker_exit(1);
  } catch (const std::exception& e) {
    write_error_record(dir, rank, "exception", e.what());
    runtime::log(runtime::LogLevel::kError, "failed: " + std::string(e.what()));
    worker_exit(1);
  } catch (...) {
    write_error_record(dir, rank, "exception", "unknown exception");
    worker_exit(1);
  }
}

}  // namespace fulgur::detail
