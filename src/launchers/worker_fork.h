// SPDX-License-Identifier: Apache-2.0
#pragma once
// How MultiProcessLauncher creates each worker process: fork(2), called
// through a pointer that a test may replace. A test seam, and nothing else
// sets it: a test cannot make the k-th fork of a launch fail for real when it
// runs as root (RLIMIT_NPROC does not bind root), so it installs a function
// that fails where it wants and forks otherwise.

#include <sys/types.h>

#include <cstdint>

namespace fulgur::detail {

// Called once per worker, in local rank order, with the worker's local rank;
// returns what fork(2) returns (-1 with errno set when no process was made).
using WorkerForkFn = pid_t (*)(int64_t local_rank);

// Makes `fn` the function the launcher forks with (nullptr: fork(2) itself)
// and returns the one it replaces. REQUIRES: no launch is running.
WorkerForkFn set_worker_fork(WorkerForkFn fn);

}  // namespace fulgur::detail
