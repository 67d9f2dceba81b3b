// SPDX-License-Identifier: Apache-2.0
#pragma once
// Where the failures of a launch are written down, for the launcher to explain them:
// - each worker's error record, a file in the launch's folder that the worker writes before it
//   exits on an exception (rank, time, kind, message);
// - across nodes, the job's first failure, a key in the store node 0's launcher serves on
//   MASTER_PORT, which tells the other nodes' launchers to stop their workers too.

#include <fulgur/launchers/launcher.h>

#include <chrono>
#include <cstdint>
#include <string>

namespace fulgur::detail {

// The clock of error records and of the exits the launcher observes (seconds since the epoch,
// system clock): both are compared to find the first failure.
double failure_time_now();

// A worker's error record. `kind` is "exception", "collective" (usually the consequence of
// another rank's failure) or "interrupted" (a stop signal ended the worker's run).
struct ErrorRecord {
  bool present = false;
  double time = 0;
  std::string kind;
  std::string message;
};

// Writes rank `rank`'s record in the launch folder `dir` (atomically: a reader sees a whole record
// or none). Called by the worker as it fails.
void write_error_record(const std::string& dir, int64_t rank, const std::string& kind, const std::string& message);
// Rank `rank`'s record in `dir`; `present` is false when it wrote none.
ErrorRecord read_error_record(const std::string& dir, int64_t rank);

// The store of a job across nodes. Node 0's launcher serves it on MASTER_PORT for the life of the
// process (each launch's keys under "launch-<i>/"), so that it outlives any worker and carries
// the first failure to the other nodes; the other nodes' launchers connect to it (to record or
// read failures) once node 0 accepts connections.
//
// On node 0, starts serving it, before any worker needs it; does nothing once it is served.
// Throws CollectiveError when node 0 cannot serve it (MASTER_PORT taken).
void serve_node_store(const MultiProcessLauncherOptions& o);

// Records a node's first failure in the job's store under `keys` (the attempt's
// launch_store_prefix), unless another node's came first. Best effort: the store may be gone
// with node 0.
void report_failure_to_job(const MultiProcessLauncherOptions& o, const std::string& keys, const std::string& what);

// The first failure another node recorded under `keys` (this attempt's), or "".
std::string failure_elsewhere(const MultiProcessLauncherOptions& o, const std::string& keys,
                              std::chrono::milliseconds connect_timeout = std::chrono::seconds(3));

}  // namespace fulgur::detail
