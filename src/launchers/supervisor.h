// SPDX-License-Identifier: Apache-2.0
#pragma once
// Watching one attempt's workers on this node until every one has exited. The supervisor is in
// one of three states:
//
//   Running ──(a worker fails, or another node records a failure)──▶ Stopping{failure, grace_period}
//   any     ──(a stop signal reaches this process)──────────────────▶ Stopping{signal, stop_timeout}
//   Stopping ──(its deadline passes, or a second stop signal)───────▶ Killing
//
// Entering Stopping sends SIGTERM (or, for a stop signal, that signal) to the workers still
// running; entering Killing sends them SIGKILL. A worker's failure once the supervisor is no
// longer Running is taken as a consequence of the stop and changes nothing. A signal that comes
// while stopping for a failure keeps the earlier deadline if it is sooner. What happened is kept
// in a SupervisionLog for diagnose() (diagnose.h).

#include <fulgur/launchers/launcher.h>

#include <sys/types.h>

#include <string>
#include <vector>

#include "launchers/diagnose.h"

namespace fulgur::detail {

struct Supervised {
  std::vector<WorkerExit> exits;  // by local rank
  SupervisionLog log;
};

// Supervises the workers `pids` (by local rank) of the attempt whose keys in the job's store are
// `keys` and whose folder is `dir`, until all have exited, then clears the recorded stop signal.
// With several nodes, records this node's first failure in the job's store and polls it for
// another node's. REQUIRES: a runtime::StopSignalGuard installed, after the forks (a forked
// worker would otherwise inherit it as already installed, and its own guard would not install
// its handlers).
Supervised supervise(const MultiProcessLauncherOptions& options, const std::vector<pid_t>& pids,
                     const std::string& dir, const std::string& keys);

}  // namespace fulgur::detail
