// SPDX-License-Identifier: Apache-2.0
#pragma once
// Starting the workers of one attempt of a launch, and the worker's side of it. The parent builds
// each worker's environment (worker_env.h) and forks; a forked worker runs the function on a
// fresh thread, a spawned one (start_method "spawn") executes the program again. Either way the
// worker ends in run_worker: rank 0 saves its result in the launch's folder, a failing worker
// writes its error record (failure_store.h), and the process exits.

#include <fulgur/launchers/launcher.h>

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace fulgur::detail {

// Launches this process has made (the parent) or replayed (a spawned worker); a forked worker
// starts from its launch's index.
int& launch_count();

// The variables every worker of launch `index` (folder `dir`) gets: the thread settings, the
// torchrun names (WORLD_SIZE, MASTER_ADDR, ...) and the launcher's own (worker_env.h). RANK,
// LOCAL_RANK and FULGUR_RESTART_COUNT are set per worker and per attempt.
std::map<std::string, std::string> worker_environment(const MultiProcessLauncherOptions& options,
                                                      const std::string& dir, int64_t index);

// Starts this node's workers of launch `index` with `env`, in local rank order, and returns their
// pids by local rank; a forked worker runs `fn` and never returns. When a worker cannot be
// started, kills and reaps the ones that were, records the failure in the job's store (several
// nodes, under `keys`) and throws std::runtime_error naming the rank and the reason.
std::vector<pid_t> start_workers(const MultiProcessLauncherOptions& options, const WorkerFn& fn,
                                 const std::map<std::string, std::string>& env, int64_t index,
                                 const std::string& keys);

// Runs `fn` as this worker's part of a launch, reports, and exits. REQUIRES: a fulgur worker.
[[noreturn]] void run_worker(const WorkerFn& fn);

}  // namespace fulgur::detail
