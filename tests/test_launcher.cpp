// SPDX-License-Identifier: Apache-2.0
// The launcher's failure report (src/launchers/diagnose.h) from hand-made exits and error
// records: no process is started. The reports of real failed jobs are checked in
// test_strategies, test_reliability and test_multinode.

#include "launchers/diagnose.h"

#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>

using fulgur::detail::diagnose;
using fulgur::detail::ErrorRecord;
using fulgur::detail::FailureReport;
using fulgur::detail::JobView;
using fulgur::detail::SupervisionLog;
using fulgur::detail::WorkerExit;

namespace {

WorkerExit exited(int64_t rank, int code, double time) { return WorkerExit{rank, code, 0, time}; }
WorkerExit killed(int64_t rank, int sig, double time) { return WorkerExit{rank, 0, sig, time}; }

ErrorRecord record(const std::string& kind, const std::string& message, double time) {
  return ErrorRecord{true, time, kind, message};
}

// The supervisor stopped the others after a failure at `time`.
SupervisionLog stopped_at(double time) {
  SupervisionLog log;
  log.stopped_for_failure = true;
  log.stop_time = time;
  return log;
}

}  // namespace

TEST(Diagnose, AllWorkersExitingWithZeroIsSuccess) {
  const FailureReport r = diagnose({exited(0, 0, 1), exited(1, 0, 2)}, {}, {}, {});
  EXPECT_TRUE(r.ok);
  EXPECT_EQ(r.report, "");
}

TEST(Diagnose, AWorkerKilledByASignalIsTheRootCauseAndTheStoppedOnesFollow) {
  // Rank 1 segfaulted at t=10; the supervisor sent SIGTERM to rank 0 at t=10.5.
  const FailureReport r = diagnose({killed(0, SIGTERM, 11), killed(1, SIGSEGV, 10)}, {}, stopped_at(10.5), {});
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.report, "worker rank 1 failed first: it was killed by SIGSEGV (then stopped: rank 0)");
  EXPECT_EQ(r.rank, 1);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_FALSE(r.interrupted);
}

TEST(Diagnose, AWorkerThatRaisedIsReportedWithItsRecordedMessage) {
  const FailureReport r =
      diagnose({exited(0, 1, 5), exited(1, 0, 6)}, {{0, record("exception", "training_step returned nothing", 4)}},
               stopped_at(5), {});
  EXPECT_EQ(r.report, "worker rank 0 failed first: it exited with code 1: training_step returned nothing");
  EXPECT_EQ(r.rank, 0);
}

TEST(Diagnose, AWorkerThatExitedNonZeroWithoutARecordIsReportedByItsCode) {
  const FailureReport r = diagnose({exited(0, 0, 5), exited(1, 3, 4)}, {}, stopped_at(4), {});
  EXPECT_EQ(r.report, "worker rank 1 failed first: it exited with code 3");
  EXPECT_EQ(r.exit_code, 1);  // the launching program's code, whatever the worker's
}

TEST(Diagnose, TheFirstFailureByTimeWinsAndARecordsTimeIsTheFailuresTime) {
  // Rank 0's exit was seen first (t=12 against 13), but rank 1 recorded its failure at t=10.
  const FailureReport r = diagnose({exited(0, 2, 12), exited(1, 1, 13)}, {{1, record("exception", "late exit", 10)}},
                                   stopped_at(12), {});
  EXPECT_EQ(r.report, "worker rank 1 failed first: it exited with code 1: late exit (then stopped: rank 0)");
}

TEST(Diagnose, ACollectiveErrorIsAConsequenceEvenWhenItCameFirst) {
  const FailureReport r = diagnose(
      {exited(0, 1, 3), exited(1, 1, 4), exited(2, 1, 5)},
      {{0, record("collective", "peer left", 1)}, {1, record("exception", "boom", 2)}, {2, record("exception", "bang", 3)}},
      stopped_at(4), {});
  EXPECT_EQ(r.report, "worker rank 1 failed first: it exited with code 1: boom (then stopped: rank 2, rank 0)");
}

TEST(Diagnose, ASigtermBeforeTheStopIsARootCauseAfterItAConsequence) {
  // Rank 0 was sent SIGTERM by someone else before any failure; rank 1 by the supervisor.
  const FailureReport before = diagnose({killed(0, SIGTERM, 1), killed(1, SIGTERM, 3)}, {}, stopped_at(2), {});
  EXPECT_EQ(before.report, "worker rank 0 failed first: it was killed by SIGTERM (then stopped: rank 1)");
  // Stopped workers only: the earliest of them is named.
  const FailureReport after = diagnose({killed(0, SIGKILL, 4), killed(1, SIGTERM, 3)}, {}, stopped_at(2), {});
  EXPECT_EQ(after.report, "worker rank 1 failed first: it was killed by SIGTERM (then stopped: rank 0)");
}

TEST(Diagnose, AForwardedStopSignalIsAnInterruptionWithTheSignalsExitCode) {
  SupervisionLog log;
  log.forwarded_signal = SIGTERM;
  JobView job;
  job.stop_timeout_ms = 30000;
  const FailureReport r = diagnose({exited(0, 143, 2), exited(1, 0, 2)},
                                   {{0, record("interrupted", "stopped by SIGTERM", 1)}}, log, job);
  EXPECT_EQ(r.report, "job interrupted by SIGTERM; rank 0 exited with code 143: stopped by SIGTERM");
  EXPECT_TRUE(r.interrupted);
  EXPECT_EQ(r.exit_code, 128 + SIGTERM);

  log.killed_after_signal = true;
  EXPECT_EQ(diagnose({killed(0, SIGKILL, 31)}, {}, log, job).report,
            "job interrupted by SIGTERM; rank 0 was killed by SIGKILL; the workers still running 30000 ms after it "
            "(stop_timeout) were killed");
  log.hurried = true;
  log.forwarded_signal = SIGINT;
  const FailureReport twice = diagnose({killed(0, SIGKILL, 3)}, {}, log, job);
  EXPECT_EQ(twice.report, "job interrupted by SIGINT; rank 0 was killed by SIGKILL; a second signal killed the "
                          "workers still running");
  EXPECT_EQ(twice.exit_code, 128 + SIGINT);
}

TEST(Diagnose, AcrossNodesTheCauseElsewhereIsAskedOnlyWhenThisNodesFirstFailureIsAConsequence) {
  int asked = 0;
  JobView job;
  job.several_nodes = true;
  job.node_rank = 1;
  job.failure_elsewhere = [&] {
    ++asked;
    return std::string("node 0: worker rank 0 was killed by SIGKILL");
  };
  // A root cause here: the node names itself, and the store is not asked.
  const FailureReport here = diagnose({exited(2, 1, 1), killed(3, SIGTERM, 3)}, {{2, record("exception", "boom", 1)}},
                                      stopped_at(2), job);
  EXPECT_EQ(here.report, "node 1: worker rank 2 failed first: it exited with code 1: boom (then stopped: rank 3)");
  EXPECT_EQ(asked, 0);
  // Only consequences here: the other node's failure is named first.
  const FailureReport there =
      diagnose({exited(2, 1, 3), killed(3, SIGTERM, 4)}, {{2, record("collective", "peer left", 3)}}, stopped_at(2), job);
  EXPECT_EQ(there.report,
            "node 1 stopped because the job failed on node 0: worker rank 0 was killed by SIGKILL; here worker rank 2 "
            "failed first: it exited with code 1: peer left (then stopped: rank 3)");
  EXPECT_EQ(asked, 1);
  // Nothing recorded elsewhere: the node names itself.
  job.failure_elsewhere = [] { return std::string(); };
  EXPECT_EQ(diagnose({exited(2, 1, 3)}, {{2, record("collective", "peer left", 3)}}, stopped_at(2), job).report,
            "node 1: worker rank 2 failed first: it exited with code 1: peer left");
}

TEST(Diagnose, WaitStatusesAndSignalNamesAreDecoded) {
  const WorkerExit code = WorkerExit::from_wait_status(4, W_EXITCODE(3, 0), 1.5);
  EXPECT_EQ(code.rank, 4);
  EXPECT_EQ(code.exit_code, 3);
  EXPECT_EQ(code.signal, 0);
  EXPECT_EQ(code.time, 1.5);
  const WorkerExit sig = WorkerExit::from_wait_status(0, W_EXITCODE(0, SIGKILL), 2);
  EXPECT_EQ(sig.signal, SIGKILL);
  EXPECT_FALSE(sig.ok());
  EXPECT_TRUE(WorkerExit::from_wait_status(0, W_EXITCODE(0, 0), 2).ok());
  EXPECT_EQ(fulgur::runtime::signal_name(SIGSEGV), "SIGSEGV");
  EXPECT_EQ(fulgur::runtime::signal_name(SIGUSR1), "signal " + std::to_string(SIGUSR1));
}
