// SPDX-License-Identifier: Apache-2.0
#include "launchers/supervisor.h"

#include "launchers/failure_store.h"
#include "runtime/signals.h"

#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <thread>
#include <variant>

namespace fulgur::detail {
namespace {

using Clock = std::chrono::steady_clock;

struct Running {};
enum class StopReason { kFailure, kFailureElsewhere, kSignal };
struct Stopping {
  StopReason reason;
  Clock::time_point deadline;  // then SIGKILL
};
struct Killing {};
using State = std::variant<Running, Stopping, Killing>;

class Supervisor {
 public:
  Supervisor(const MultiProcessLauncherOptions& options, const std::vector<pid_t>& pids, const std::string& dir,
             const std::string& keys)
      : o_(options), pids_(pids), dir_(dir), keys_(keys), exits_(pids.size()), alive_(pids.size()) {}

  Supervised run() {
    while (alive_ > 0) {
      if (o_.num_nodes() > 1 && running()) poll_other_nodes();
      forward_stop_signals();
      const bool progressed = reap();
      if (alive_ > 0 && Clock::now() >= deadline()) kill_the_rest();
      if (!progressed) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    runtime::clear_stop_signal();
    Supervised out;
    for (const auto& e : exits_) out.exits.push_back(*e);
    out.log = log_;
    return out;
  }

 private:
  bool running() const { return std::holds_alternative<Running>(state_); }
  Clock::time_point deadline() const {
    const auto* s = std::get_if<Stopping>(&state_);
    return s ? s->deadline : Clock::time_point::max();
  }
  int64_t rank_of(size_t local) const { return o_.node_rank() * static_cast<int64_t>(pids_.size()) + static_cast<int64_t>(local); }

  void signal_alive(int sig) {
    for (size_t i = 0; i < pids_.size(); ++i)
      if (!exits_[i]) ::kill(pids_[i], sig);
  }

  // Running → Stopping: SIGTERM to the others, which get grace_period.
  void stop_for_failure(StopReason reason) {
    log_.stopped_for_failure = true;
    log_.stop_time = failure_time_now();
    signal_alive(SIGTERM);
    state_ = Stopping{reason, Clock::now() + o_.grace_period()};
  }

  // Another node's failure stops this node's workers too (polled every 500 ms).
  void poll_other_nodes() {
    if (Clock::now() < next_poll_) return;
    if (!failure_elsewhere(o_, keys_, std::chrono::milliseconds(1000)).empty()) {
      stop_for_failure(StopReason::kFailureElsewhere);
    }
    next_poll_ = Clock::now() + std::chrono::milliseconds(500);
  }

  // The first stop signal goes to the workers, which get stop_timeout (or what is left of the
  // grace period, if sooner); a second one kills them now.
  void forward_stop_signals() {
    if (log_.forwarded_signal == 0 && runtime::received_stop_signal() != 0) {
      log_.forwarded_signal = runtime::received_stop_signal();
      signal_alive(log_.forwarded_signal);
      state_ = Stopping{StopReason::kSignal, std::min(deadline(), Clock::now() + o_.stop_timeout())};
    }
    if (log_.forwarded_signal != 0 && !log_.hurried && runtime::stop_signal_count() > 1) {
      log_.hurried = true;
      state_ = Stopping{StopReason::kSignal, Clock::now()};
    }
  }

  // Collects the workers that exited; returns whether any did.
  bool reap() {
    bool progressed = false;
    for (size_t i = 0; i < pids_.size(); ++i) {
      if (exits_[i]) continue;
      int status = 0;
      if (::waitpid(pids_[i], &status, WNOHANG) != pids_[i]) continue;
      exits_[i] = WorkerExit::from_wait_status(rank_of(i), status, failure_time_now());
      --alive_;
      progressed = true;
      if (!exits_[i]->ok() && running()) on_first_failure(*exits_[i]);
    }
    return progressed;
  }

  void on_first_failure(const WorkerExit& exit) {
    if (o_.num_nodes() > 1) {
      const ErrorRecord rec = read_error_record(dir_, exit.rank);
      // A collective error here is the consequence of a failure elsewhere, which that node reports.
      if (!(rec.present && rec.kind == "collective")) {
        report_failure_to_job(o_, keys_, "worker rank " + std::to_string(exit.rank) + " " + how_it_ended(exit, rec));
      }
    }
    stop_for_failure(StopReason::kFailure);
  }

  // Stopping → Killing: SIGKILL to the workers still running.
  void kill_the_rest() {
    log_.killed_after_signal = log_.forwarded_signal != 0;
    signal_alive(SIGKILL);
    state_ = Killing{};
  }

  const MultiProcessLauncherOptions& o_;
  const std::vector<pid_t>& pids_;
  const std::string& dir_;
  const std::string& keys_;
  std::vector<std::optional<WorkerExit>> exits_;  // by local rank; empty while it runs
  size_t alive_;
  State state_ = Running{};
  SupervisionLog log_;
  Clock::time_point next_poll_ = Clock::now();
};

}  // namespace

Supervised supervise(const MultiProcessLauncherOptions& options, const std::vector<pid_t>& pids,
                     const std::string& dir, const std::string& keys) {
  return Supervisor(options, pids, dir, keys).run();
}

}  // namespace fulgur::detail
