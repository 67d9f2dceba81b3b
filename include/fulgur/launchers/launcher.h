// SPDX-License-Identifier: Apache-2.0
#pragma once
// Launcher: starts the worker processes of a job and supervises them.

#include <torch/arg.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>

namespace c10 {
struct IValue;
}  // namespace c10

namespace fulgur {

// What a worker runs; rank 0's return value travels back to the caller.
using WorkerFn = std::function<c10::IValue()>;

class Launcher {
 public:
  virtual ~Launcher() = default;
  // Runs `fn` on every rank of the job and returns global rank 0's result in
  // the calling process. In a worker this process already belongs to, runs
  // `fn` here. Throws WorkerFailure when a worker fails.
  virtual c10::IValue launch(const WorkerFn& fn) = 0;
  // True when launch() creates new processes (fit twice is then refused).
  virtual bool creates_processes() const = 0;
};

// A worker of the job failed; what() is the parent's report.
class WorkerFailure : public std::runtime_error {
 public:
  WorkerFailure(const std::string& report, int rank, int exit_code)
      : std::runtime_error(report), rank_(rank), exit_code_(exit_code) {}
  // The rank that failed first.
  int rank() const { return rank_; }
  // The exit code the launching program should end with (143 after SIGTERM).
  int exit_code() const { return exit_code_; }

 private:
  int rank_;
  int exit_code_;
};

// How a MultiProcessLauncher starts and supervises the workers of this node.
//
// Example:
//   fulgur::MultiProcessLauncherOptions().num_processes(4).start_method("spawn")
struct MultiProcessLauncherOptions {
  // Workers on this node.
  TORCH_ARG(int64_t, num_processes) = 1;
  TORCH_ARG(int64_t, num_nodes) = 1;
  TORCH_ARG(int64_t, node_rank) = 0;
  // "fork": the workers are copies of this process made at launch (the
  // default, as Lightning's XLA launcher). "spawn": the program is started
  // again with the worker's environment, and earlier launches are replayed
  // from their saved results.
  TORCH_ARG(std::string, start_method) = "fork";
  // After the first failure: how long the others get between SIGTERM and SIGKILL.
  TORCH_ARG(std::chrono::milliseconds, grace_period) = std::chrono::milliseconds(5000);
  // After a stop signal (SIGTERM, SIGINT) forwarded to the workers: how long
  // they get to finish their batch, save last.ckpt and exit before SIGKILL.
  // A second signal to this process sends SIGKILL at once. Default 30 s, a
  // scheduler's usual grace between SIGTERM and SIGKILL.
  TORCH_ARG(std::chrono::milliseconds, stop_timeout) = std::chrono::milliseconds(30000);
  // How many times a failed job is started again (torchrun's
  // --max-restarts). When a worker fails (an exception, a signal, a
  // collective error because a peer or a whole node is gone), every worker of
  // the attempt is stopped as above; once all have exited, the launcher logs
  // the attempt's root cause and starts them all again, with
  // FULGUR_RESTART_COUNT set to the restart's number. A fit then resumes from
  // the last.ckpt an earlier attempt's ModelCheckpoint wrote (save_last, or
  // SIGTERM's checkpoint), else from its own ckpt_path, else from scratch. A
  // stop signal, a worker that cannot be started, or the last attempt's
  // failure ends the job; its WorkerFailure lists every attempt's root cause.
  // With several nodes, give every node the same value: each node's launcher
  // restarts its own workers, and each attempt meets under keys of its own.
  // Default 0: the first failure ends the job. Negative: std::invalid_argument.
  TORCH_ARG(int64_t, max_restarts) = 0;
  // Rendezvous for several nodes (MASTER_ADDR, MASTER_PORT).
  TORCH_ARG(std::string, main_address) = "127.0.0.1";
  TORCH_ARG(int, main_port) = 0;
  // This process was started by torchrun, srun or by hand as one of the job's
  // (ClusterEnvironment::creates_processes_externally): launch runs the
  // function here and starts nothing.
  TORCH_ARG(bool, processes_created_externally) = false;
};

class MultiProcessLauncher : public Launcher {
 public:
  // Throws std::invalid_argument for an unknown start method, num_processes < 1,
  // max_restarts < 0, or max_restarts > 0 with processes created externally.
  explicit MultiProcessLauncher(MultiProcessLauncherOptions options);
  c10::IValue launch(const WorkerFn& fn) override;
  bool creates_processes() const override { return true; }
  const MultiProcessLauncherOptions& options() const { return options_; }

 private:
  MultiProcessLauncherOptions options_;
};

// True inside a worker process started by MultiProcessLauncher.
bool is_fulgur_worker();

}  // namespace fulgur
