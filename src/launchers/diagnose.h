// SPDX-License-Identifier: Apache-2.0
#pragma once
// How an attempt of a launch ended, explained from plain data: each worker's exit (its code or
// signal, and when the launcher saw it), the error records the workers wrote (failure_store.h),
// and what the supervisor did (stopped the others after a failure, forwarded a stop signal,
// killed the ones still running). It starts, signals and reads nothing, so that its rules can be
// tested with hand-made exits (tests/test_launcher.cpp), as torchelastic's ProcessFailure and
// its root-cause choice can.
//
// The root cause is the earliest failure that is not a consequence of another: a collective
// error (a peer left) and a worker killed by SIGTERM or SIGKILL once the launcher began stopping
// the others are consequences. A record's time wins over the exit's (the worker wrote it as it
// failed).

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "launchers/failure_store.h"
#include "runtime/signals.h"

namespace fulgur::detail {

// One worker's exit as waitpid(2) reported it.
struct WorkerExit {
  int64_t rank = 0;   // global rank
  int exit_code = 0;  // when it exited (signal == 0)
  int signal = 0;     // the signal that ended it, 0 when it exited
  double time = 0;    // when the launcher saw it (failure_time_now())

  // From a wait status (WIFEXITED / WIFSIGNALED).
  static WorkerExit from_wait_status(int64_t rank, int status, double time);
  bool ok() const { return signal == 0 && exit_code == 0; }
};

// What the supervisor did during the attempt.
struct SupervisionLog {
  // The supervisor began stopping the others after a failure (here or on another node), at
  // `stop_time`.
  bool stopped_for_failure = false;
  double stop_time = 0;
  // The stop signal forwarded to the workers (SIGTERM, SIGINT), 0 when none was.
  int forwarded_signal = 0;
  // SIGKILL went to workers still running after the forwarded signal, because stop_timeout
  // passed or (`hurried`) a second signal came.
  bool killed_after_signal = false;
  bool hurried = false;
};

// The job the attempt belongs to, as the report needs it.
struct JobView {
  int64_t node_rank = 0;
  bool several_nodes = false;
  int64_t stop_timeout_ms = 0;
  // Several nodes: the first failure another node recorded ("" if none). Asked only when this
  // node's first failure is a consequence, to name the cause (a store lookup in the launcher).
  std::function<std::string()> failure_elsewhere;
};

// How an attempt ended.
struct FailureReport {
  bool ok = false;
  // The failure report (empty when ok): the root cause first.
  std::string report;
  int rank = 0;
  // The code the launching program should exit with: 1 for a failure, 128 + signal when a
  // stop signal was forwarded.
  int exit_code = 0;
  // A stop signal was forwarded to the workers: the job is not restarted.
  bool interrupted = false;
};

// How a worker ended, as the reports say it: "was killed by SIGKILL" or "exited with code 3",
// followed by ": <message>" when it left a record.
std::string how_it_ended(const WorkerExit& exit, const ErrorRecord& record);

// The report of an attempt. `records` holds the records of the failed workers, by rank (a rank
// with none: no record). Pure apart from `job.failure_elsewhere`, which it calls at most once.
FailureReport diagnose(const std::vector<WorkerExit>& exits, const std::map<int64_t, ErrorRecord>& records,
                       const SupervisionLog& log, const JobView& job);

}  // namespace fulgur::detail
