// SPDX-License-Identifier: Apache-2.0
#include "launchers/diagnose.h"

#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <sstream>

namespace fulgur::detail {
namespace {

// One failed worker, ranked for the report.
struct Failure {
  int64_t rank;
  double time;
  int priority;  // 0 root cause, 1 consequence
  std::string how;
};

// The failed workers, root causes first, each group by time.
std::vector<Failure> ranked_failures(const std::vector<WorkerExit>& exits, const std::map<int64_t, ErrorRecord>& records,
                                     const SupervisionLog& log) {
  std::vector<Failure> failures;
  for (const WorkerExit& e : exits) {
    if (e.ok()) continue;
    const auto it = records.find(e.rank);
    const ErrorRecord rec = it == records.end() ? ErrorRecord{} : it->second;
    Failure f{e.rank, rec.present ? rec.time : e.time, 0, how_it_ended(e, rec)};
    if (e.signal != 0) {
      const bool ours = e.signal == SIGTERM || e.signal == SIGKILL;
      if (log.stopped_for_failure && ours && e.time >= log.stop_time) f.priority = 1;
    } else if (rec.present && rec.kind == "collective") {
      f.priority = 1;
    }
    failures.push_back(f);
  }
  std::sort(failures.begin(), failures.end(), [](const Failure& a, const Failure& b) {
    return a.priority != b.priority ? a.priority < b.priority : a.time < b.time;
  });
  return failures;
}

// A stop signal was forwarded: the job was interrupted, whatever failed.
FailureReport interrupted_report(const Failure& first, const SupervisionLog& log, const JobView& job) {
  std::string what = "job interrupted by " + runtime::signal_name(log.forwarded_signal) + "; rank " +
                     std::to_string(first.rank) + " " + first.how;
  if (log.killed_after_signal) {
    what += log.hurried ? "; a second signal killed the workers still running"
                        : "; the workers still running " + std::to_string(job.stop_timeout_ms) +
                              " ms after it (stop_timeout) were killed";
  }
  return FailureReport{false, what, static_cast<int>(first.rank), 128 + log.forwarded_signal, true};
}

}  // namespace

WorkerExit WorkerExit::from_wait_status(int64_t rank, int status, double time) {
  WorkerExit e;
  e.rank = rank;
  e.time = time;
  if (WIFSIGNALED(status)) {
    e.signal = WTERMSIG(status);
  } else {
    e.exit_code = WEXITSTATUS(status);
  }
  return e;
}

std::string how_it_ended(const WorkerExit& exit, const ErrorRecord& record) {
  std::string how = exit.signal != 0 ? "was killed by " + runtime::signal_name(exit.signal)
                                     : "exited with code " + std::to_string(exit.exit_code);
  if (record.present) how += ": " + record.message;
  return how;
}

FailureReport diagnose(const std::vector<WorkerExit>& exits, const std::map<int64_t, ErrorRecord>& records,
                       const SupervisionLog& log, const JobView& job) {
  const std::vector<Failure> failures = ranked_failures(exits, records, log);
  if (failures.empty()) return FailureReport{true, "", 0, 0, false};
  const Failure& first = failures.front();
  if (log.forwarded_signal != 0) return interrupted_report(first, log, job);
  std::ostringstream report;
  const bool ask = job.several_nodes && first.priority == 1 && job.failure_elsewhere;
  const std::string elsewhere = ask ? job.failure_elsewhere() : "";
  if (!elsewhere.empty()) {
    report << "node " << job.node_rank << " stopped because the job failed on " << elsewhere << "; here ";
  } else if (job.several_nodes) {
    report << "node " << job.node_rank << ": ";
  }
  report << "worker rank " << first.rank << " failed first: it " << first.how;
  if (failures.size() > 1) {
    report << " (then stopped: ";
    for (size_t i = 1; i < failures.size(); ++i) report << (i > 1 ? ", " : "") << "rank " << failures[i].rank;
    report << ")";
  }
  return FailureReport{false, report.str(), static_cast<int>(first.rank), 1, false};
}

}  // namespace fulgur::detail
