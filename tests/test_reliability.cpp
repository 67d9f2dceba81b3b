// SPDX-License-Identifier: Apache-2.0
// Faults injected for real (../shared/spec/reliability.md): signals sent to a
// running job, a parent killed under its workers, processes killed while they
// write checkpoints, the sockets and folders of a running job, and the
// checkpoint format read and written by Python's torch.

#include "support.h"

#include <fulgur/accelerators/accelerator.h>
#include <fulgur/data/data_loader.h>
#include <fulgur/launchers/launcher.h>
#include <fulgur/lightning_module.h>
#include <fulgur/plugins/io/checkpoint_io.h>
#include <fulgur/strategies/ddp.h>
#include <fulgur/strategies/single_device.h>

#include "launchers/worker_fork.h"
#include "trainer/stop_poll.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <dlfcn.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <atomic>
#include <random>
#include <set>
#include <sstream>
#include <thread>

extern char** environ;

using namespace fulgur;
using fulgur::testing::read_file;
using fulgur::testing::TempDir;
using ::testing::HasSubstr;
using ::testing::Not;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

// A program started with posix_spawn, its stdout and stderr in files.
struct Child {
  Child(const std::vector<std::string>& argv, const std::string& out_dir, const std::vector<std::string>& env_extra = {}) {
    out = out_dir + "/stdout.txt";
    err = out_dir + "/stderr.txt";
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&fa, STDERR_FILENO, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    std::vector<std::string> env_strings(env_extra);
    for (char** e = environ; *e; ++e) env_strings.emplace_back(*e);  // earlier entries win
    std::vector<char*> envp;
    for (auto& e : env_strings) envp.push_back(e.data());
    envp.push_back(nullptr);
    const int rc = posix_spawn(&pid, args[0], &fa, nullptr, args.data(), envp.data());
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) throw std::runtime_error("posix_spawn " + argv[0] + ": " + std::strerror(rc));
  }
  ~Child() {
    if (pid > 0 && !reaped) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  }
  // Waits until stdout contains `text`; false after `seconds` or if the child exited.
  bool wait_for_output(const std::string& text, double seconds) {
    const auto end = Clock::now() + std::chrono::duration<double>(seconds);
    while (Clock::now() < end) {
      if (read_file(out).find(text) != std::string::npos) return true;
      if (::waitpid(pid, &status, WNOHANG) == pid) {
        reaped = true;
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }
  // The exit code (128+signal when killed), or -1 after `seconds`.
  int wait(double seconds) {
    const auto end = Clock::now() + std::chrono::duration<double>(seconds);
    while (!reaped && Clock::now() < end) {
      if (::waitpid(pid, &status, WNOHANG) == pid) {
        reaped = true;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (!reaped) return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  std::string stdout_text() const { return read_file(out); }
  std::string stderr_text() const { return read_file(err); }

  pid_t pid = -1;
  int status = 0;
  bool reaped = false;
  std::string out, err;
};

// Pids whose parent is `parent` (from /proc/<pid>/stat).
std::vector<pid_t> children_of(pid_t parent) {
  std::vector<pid_t> out;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string stat = read_file(e.path().string() + "/stat");
    const auto close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(stat.substr(close + 2));
    char state = 0;
    pid_t ppid = 0;
    rest >> state >> ppid;
    if (ppid == parent) out.push_back(static_cast<pid_t>(std::stol(name)));
  }
  return out;
}

// True while `pid` exists and is not a zombie.
bool running(pid_t pid) {
  const std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
  if (stat.empty()) return false;
  const auto close = stat.rfind(')');
  return close != std::string::npos && stat.size() > close + 2 && stat[close + 2] != 'Z';
}

// The MNIST example on 2 cpu workers, 100 steps of 64 per worker.
std::vector<std::string> mnist_job(const std::string& root, const std::vector<std::string>& extra = {}) {
  std::vector<std::string> a = {fulgur::testing::program("mnist"),  "--data-dir",     fulgur::testing::mnist_dir(),
                                "--accelerator", "cpu",            "--devices",
                                "2",           "--strategy",     "ddp",
                                "--train-samples", "12800",        "--max-epochs",
                                "1",           "--no-test",      "--default-root-dir",
                                root};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

int64_t global_step_of(const std::string& ckpt) {
  return TorchCheckpointIO().load_checkpoint(ckpt).at("global_step").toInt();
}

}  // namespace

TEST(Signals, SigtermMidEpochCheckpointsExits143AndResumes) {
  TempDir dir;
  const std::string root = dir.path + "/run";
  {
    Child job(mnist_job(root), dir.path);
    ASSERT_TRUE(job.wait_for_output("Epoch 0: 10/100", 60)) << job.stderr_text();
    const auto workers = children_of(job.pid);
    ASSERT_EQ(workers.size(), 2u);
    ::kill(job.pid, SIGTERM);  // as a scheduler would: the parent only
    EXPECT_EQ(job.wait(30), 143) << job.stderr_text();
    EXPECT_THAT(job.stderr_text(), HasSubstr("checkpoint saved to"));
    for (pid_t w : workers) EXPECT_FALSE(running(w)) << "worker " << w << " outlived the job";
  }
  const std::string ckpt = root + "/lightning_logs/version_0/checkpoints/last.ckpt";
  ASSERT_TRUE(fs::exists(ckpt));
  const int64_t stopped_at = global_step_of(ckpt);
  EXPECT_GE(stopped_at, 10);
  EXPECT_LT(stopped_at, 100);

  // Resuming from "last" runs the rest of the epoch, not a new one.
  Child again(mnist_job(root, {"--ckpt-path", "last"}), dir.path);
  ASSERT_EQ(again.wait(120), 0) << again.stderr_text();
  // The example prints the path of the checkpoint its run ended with.
  const std::string out = again.stdout_text();
  const auto at = out.find("checkpoint: ");
  ASSERT_NE(at, std::string::npos) << out;
  const std::string newest = out.substr(at + 12, out.find('\n', at) - at - 12);
  ASSERT_NE(newest, ckpt);
  EXPECT_EQ(global_step_of(newest), 100);
  EXPECT_EQ(TorchCheckpointIO().load_checkpoint(newest).at("epoch").toInt(), 0);
}

// Matrix products run libtorch's own BLAS (MKL in the pinned wheel), which picks its kernels by
// the CPU's instruction sets rather than a list of CPU models: the program loads no OpenBLAS,
// whose Debian build ran its SSE3 kernels on CPU models it did not know, and a training run
// prints nothing about BLAS.
TEST(Threads, MatrixProductsRunLibtorchsOwnBlas) {
  if (at::show_config().find("BLAS_INFO=open") == std::string::npos)  // a libtorch built on OpenBLAS brings it
    EXPECT_EQ(dlsym(RTLD_DEFAULT, "openblas_get_corename"), nullptr) << "OpenBLAS is loaded";
  TempDir dir;
  Child job({fulgur::testing::program("mnist"), "--data-dir", fulgur::testing::mnist_dir(), "--accelerator", "cpu",
             "--devices", "1", "--train-samples", "256", "--max-steps", "2", "--no-test", "--default-root-dir",
             dir.path + "/run"},
            dir.path, {"OPENBLAS_CORETYPE=Prescott"});
  ASSERT_EQ(job.wait(120), 0) << job.stderr_text();
  EXPECT_THAT(job.stderr_text(), Not(HasSubstr("BLAS")));
}

TEST(Signals, HandlersAreRestoredAfterFit) {
  static volatile sig_atomic_t mine = 0;
  struct sigaction sa {};
  sa.sa_handler = [](int) { mine = 1; };
  sigemptyset(&sa.sa_mask);
  ASSERT_EQ(::sigaction(SIGTERM, &sa, nullptr), 0);
  ASSERT_EQ(::sigaction(SIGINT, &sa, nullptr), 0);
  TempDir dir;
  fulgur::testing::TinyRegression m;
  Trainer t(TrainerOptions().max_epochs(1).default_root_dir(dir.path).enable_progress_bar(false)
                .enable_checkpointing(false));
  t.fit(m, std::make_shared<DataLoader>(fulgur::testing::regression_data(32), DataLoaderOptions(8)));
  for (int sig : {SIGTERM, SIGINT}) {
    struct sigaction now {};
    ASSERT_EQ(::sigaction(sig, nullptr, &now), 0);
    EXPECT_EQ(now.sa_handler, sa.sa_handler) << "handler of signal " << sig << " not restored";
  }
  ::raise(SIGTERM);
  EXPECT_EQ(mine, 1);
  signal(SIGTERM, SIG_DFL);
  signal(SIGINT, SIG_DFL);
}

TEST(Faults, KilledParentTakesItsWorkersWithinASecond) {
  TempDir dir;
  Child job(mnist_job(dir.path + "/run"), dir.path);
  ASSERT_TRUE(job.wait_for_output("Epoch 0: 10/100", 60)) << job.stderr_text();
  const auto workers = children_of(job.pid);
  ASSERT_EQ(workers.size(), 2u);
  ::kill(job.pid, SIGKILL);
  EXPECT_EQ(job.wait(5), 128 + SIGKILL);
  const auto end = Clock::now() + std::chrono::seconds(1);
  bool gone = false;
  while (!gone && Clock::now() < end) {
    gone = true;
    for (pid_t w : workers) gone = gone && !running(w);
    if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(gone) << "workers still running 1 s after their parent was killed";
  for (pid_t w : workers) {
    if (running(w)) ::kill(w, SIGKILL);
  }
}

namespace {

// The workers a launch forked through fork_failing_third (the test's seam).
std::vector<pid_t> g_forked;

// fork(2) for local ranks 0 and 1; for local rank 2 no process and EAGAIN,
// what fork returns when the process limit is reached.
pid_t fork_failing_third(int64_t local_rank) {
  if (local_rank == 2) {
    errno = EAGAIN;
    return -1;
  }
  const pid_t pid = ::fork();
  if (pid > 0) g_forked.push_back(pid);
  return pid;
}

}  // namespace

// Issue 32, item C9: the fork of worker 2 of 4 fails. The two started before
// it, which would wait at the rendezvous for the missing ones (here they sleep
// a minute), are killed and reaped at once: their pids are gone, not zombies,
// and the error names the worker and the fork's error.
TEST(Faults, FailedForkOfAWorkerKillsAndReapsTheStartedOnesAndNamesIt) {
  g_forked.clear();
  fulgur::detail::set_worker_fork(fork_failing_third);
  struct Restore {
    ~Restore() { fulgur::detail::set_worker_fork(nullptr); }
  } restore;
  MultiProcessLauncher launcher(MultiProcessLauncherOptions().num_processes(4));
  const auto start = Clock::now();
  try {
    launcher.launch([]() -> c10::IValue {
      std::this_thread::sleep_for(std::chrono::seconds(60));
      return {};
    });
    FAIL() << "the launch did not fail";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), HasSubstr("cannot start worker rank 2 (local rank 2 of 4): fork failed: " +
                                    std::string(std::strerror(EAGAIN))));
    EXPECT_THAT(e.what(), HasSubstr("the 2 worker(s) already started were killed"));
  }
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 10.0);
  ASSERT_EQ(g_forked.size(), 2u);
  for (const pid_t pid : g_forked) {
    // ESRCH: no such process, not even a zombie waiting for its parent (this test).
    EXPECT_EQ(::kill(pid, 0), -1) << "worker " << pid << " is still there";
    EXPECT_EQ(errno, ESRCH);
  }
}

// Issue 32, item D13, through the example's flags: a worker of a 2-worker
// MNIST run is SIGKILLed from outside after step 30; with --max-restarts 1 the
// job starts again from the last.ckpt of step 20 (--save-every-n-steps 10)
// and finishes with exit code 0, and no worker of the first attempt is left.
// With both start methods: a spawned worker runs main again and learns its
// attempt from the environment alone.
TEST(Faults, SigkilledWorkerOfTheExampleIsRestartedFromLastCkptAndTheRunFinishes) {
  for (const std::string method : {"fork", "spawn"}) {
    SCOPED_TRACE("start method " + method);
    TempDir dir;
    Child job(mnist_job(dir.path + "/run", {"--max-restarts", "1", "--save-every-n-steps", "10", "--start-method", method}),
              dir.path);
    ASSERT_TRUE(job.wait_for_output("Epoch 0: 30/100", 120)) << job.stderr_text();
    const auto workers = children_of(job.pid);
    ASSERT_EQ(workers.size(), 2u);
    ::kill(workers[1], SIGKILL);
    EXPECT_EQ(job.wait(240), 0) << job.stderr_text();
    const std::string err = job.stderr_text();
    EXPECT_THAT(err, HasSubstr("attempt 1 of 2 failed: worker rank"));
    EXPECT_THAT(err, HasSubstr("was killed by SIGKILL"));
    EXPECT_THAT(err, HasSubstr("restart 1 of the launch: resuming from " + dir.path +
                               "/run/lightning_logs/version_0/checkpoints/last.ckpt"));
    EXPECT_THAT(err, HasSubstr("fit stopped at epoch 1, step 100: max_epochs=1 reached"));
    for (pid_t w : workers) EXPECT_FALSE(running(w)) << "worker " << w << " of the first attempt is still running";
  }
}

TEST(Security, SingleNodeJobListensOnlyOnLoopbackAndKeepsItsRendezvousPrivate) {
  TempDir dir;
  const std::string tmp = dir.path + "/tmp";  // where the job makes its run folder
  fs::create_directories(tmp);
  Child job(mnist_job(dir.path + "/run"), dir.path, {"TMPDIR=" + tmp});
  ASSERT_TRUE(job.wait_for_output("Epoch 0: 10/100", 60)) << job.stderr_text();
  const auto workers = children_of(job.pid);
  ASSERT_EQ(workers.size(), 2u);

  // Every TCP socket of the job's processes (listening or connected), from ss.
  const std::string listing = dir.path + "/ss.txt";
  ASSERT_EQ(std::system(("ss -tanpH > " + listing).c_str()), 0) << "ss (iproute2) is needed";
  std::vector<pid_t> job_pids = workers;
  job_pids.push_back(job.pid);
  int job_sockets = 0;
  std::istringstream lines(read_file(listing));
  for (std::string line; std::getline(lines, line);) {
    bool ours = false;
    for (pid_t p : job_pids) ours = ours || line.find("pid=" + std::to_string(p) + ",") != std::string::npos;
    if (!ours) continue;
    ++job_sockets;
    std::istringstream f(line);
    std::string state, recvq, sendq, local;
    f >> state >> recvq >> sendq >> local;
    EXPECT_TRUE(local.rfind("127.", 0) == 0 || local.rfind("[::1]", 0) == 0 || local.rfind("[::ffff:127.", 0) == 0)
        << "the job has a socket on " << local << ": " << line;
  }
  EXPECT_GT(job_sockets, 0) << "no socket of the job found; the check would pass vacuously";

  // The run folder (rendezvous file store, error records) is private to the user.
  std::string launch_dir;
  for (const auto& e : fs::directory_iterator(tmp)) {
    if (e.path().filename().string().rfind("fulgur-", 0) == 0) launch_dir = e.path().string();
  }
  ASSERT_FALSE(launch_dir.empty()) << "no run folder in " << tmp;
  struct stat st {};
  ASSERT_EQ(::stat(launch_dir.c_str(), &st), 0) << launch_dir;
  EXPECT_EQ(st.st_mode & 0777, 0700u) << launch_dir;
  ::kill(job.pid, SIGTERM);
  EXPECT_EQ(job.wait(30), 143);
}

namespace {

// ~1 MiB of parameters, so that a save takes long enough to be interrupted.
struct Wide : LightningModule {
  Wide() : LightningModule("Wide") { fc = register_module("fc", torch::nn::Linear(512, 512)); }
  StepOutput training_step(const Batch& b, int64_t) override { return fc->forward(b.data).pow(2).mean(); }
  OptimizerConfig configure_optimizers() override {
    return std::make_shared<torch::optim::Adam>(parameters(), torch::optim::AdamOptions(1e-3));
  }
  torch::nn::Linear fc{nullptr};
};

}  // namespace

TEST(Faults, KillingTheWriterMidSaveNeverLeavesAPartialCheckpoint) {
  TempDir dir;
  const std::string ck = dir.path + "/ck";
  std::mt19937 rng(12345);
  std::uniform_int_distribution<int> delay_ms(30, 400);
  int killed_with_checkpoints = 0;
  for (int round = 0; round < 16; ++round) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      // Rank 0 of a one-process job: a checkpoint every step (the newest and last), until killed.
      try {
        Wide m;
        auto cb = std::make_shared<ModelCheckpoint>(
            ModelCheckpointOptions().dirpath(ck).every_n_train_steps(1).save_last(true));
        Trainer t(TrainerOptions().accelerator("cpu").devices(1).max_epochs(1000).default_root_dir(dir.path)
                      .enable_progress_bar(false)
                      .logger(false).callbacks({cb}));
        auto x = torch::randn({64, 512});
        t.fit(m, std::make_shared<DataLoader>(std::make_shared<TensorDataset>(x, x), DataLoaderOptions(32)),
              nullptr, fs::exists(ck + "/last.ckpt") ? "last" : "");
      } catch (...) {
        ::_exit(3);
      }
      ::_exit(0);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms(rng)));
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status)) << "the writer ended by itself (status " << status << ") in round " << round;

    // Every file with the final name is complete and loads; last and the
    // top-k files are never partial.
    int complete = 0;
    if (fs::exists(ck)) {
      for (const auto& e : fs::directory_iterator(ck)) {
        const std::string p = e.path().string();
        if (e.path().extension() != ".ckpt") continue;
        EXPECT_NO_THROW({
          Checkpoint c = TorchCheckpointIO().load_checkpoint(p);
          EXPECT_TRUE(c.contains("state_dict")) << p;
        }) << "round " << round << ": " << p << " is not a complete checkpoint";
        ++complete;
      }
    }
    if (complete > 0) ++killed_with_checkpoints;
  }
  EXPECT_GE(killed_with_checkpoints, 8) << "too few rounds got as far as a checkpoint to mean anything";
  // Temporaries left by the kills are removed by the next start.
  TorchCheckpointIO::remove_stale_temporaries(ck);
  for (const auto& e : fs::directory_iterator(ck)) {
    EXPECT_EQ(e.path().extension(), ".ckpt") << "left over: " << e.path();
  }
}

namespace {

using fulgur::testing::FaultyCheckpointIO;
using fulgur::testing::WriteFault;

// A ModelCheckpoint (every epoch, top 1, last.ckpt) that also writes what its
// epoch-end save threw on this rank to <record_dir>/rank-<r>, then rethrows.
struct RecordingModelCheckpoint : ModelCheckpoint {
  RecordingModelCheckpoint(const std::string& dirpath, std::string record_dir)
      : ModelCheckpoint(ModelCheckpointOptions().dirpath(dirpath).save_last(true)), record_dir(std::move(record_dir)) {}
  void on_train_epoch_end(Trainer& trainer, LightningModule& module) override {
    try {
      ModelCheckpoint::on_train_epoch_end(trainer, module);
    } catch (const std::exception& e) {
      std::ofstream(record_dir + "/rank-" + std::to_string(trainer.global_rank())) << e.what();
      throw;
    }
  }
  std::string record_dir;
};

// The names in `dir`, sorted (temporaries start with '.').
std::vector<std::string> names_in(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

std::shared_ptr<DataLoader> regression_loader() {
  return std::make_shared<DataLoader>(fulgur::testing::regression_data(32), DataLoaderOptions(4));
}

}  // namespace

// Two ranks, 4 steps an epoch each; each epoch writes its top-1 file, then
// last.ckpt (saves 1, 2 in epoch 0; 3, 4 in epoch 1), then removes the
// previous top-1 file. The disk fills during save 4, epoch 1's last.ckpt.
TEST(Faults, DiskFullDuringASaveOnTwoRanksKeepsThePreviousCheckpointAndFailsEveryRank) {
  TempDir dir;
  const std::string ck = dir.path + "/ck";
  auto io = std::make_shared<FaultyCheckpointIO>(std::make_shared<TorchCheckpointIO>(), 4, WriteFault::kDiskFull);
  auto po = ParallelOptions().timeout(std::chrono::milliseconds(20000));
  auto strategy = std::make_shared<DDPStrategy>(std::make_shared<CPUAccelerator>(), std::vector<int64_t>{0, 1}, io,
                                                nullptr, po);
  fulgur::testing::TinyRegression m;
  Trainer t(TrainerOptions().strategy(strategy).max_epochs(3).default_root_dir(dir.path)
                .enable_progress_bar(false).enable_model_summary(false).logger(false)
                .callbacks({std::make_shared<RecordingModelCheckpoint>(ck, dir.path)}));
  const std::string cause = "cannot save " + ck + "/last.ckpt: writing its temporary " + ck + "/.last.ckpt.tmp-";
  try {
    t.fit(m, regression_loader());
    FAIL() << "the fit went on after a failed save";
  } catch (const WorkerFailure& e) {
    EXPECT_THAT(e.what(), HasSubstr(cause));
    EXPECT_THAT(e.what(), HasSubstr("File too large"));
  }
  // Rank 0 wrote and has the write's own error; rank 1 has rank 0's, named as such.
  const std::string rank0 = read_file(dir.path + "/rank-0"), rank1 = read_file(dir.path + "/rank-1");
  EXPECT_THAT(rank0, HasSubstr(cause));
  EXPECT_THAT(rank0, HasSubstr("File too large; " + ck + "/last.ckpt is unchanged"));
  EXPECT_THAT(rank1, HasSubstr("save_checkpoint('" + ck + "/last.ckpt') failed on rank 0, which writes: checkpoint: " + cause));
  // last.ckpt is still epoch 0's, the top-1 file of epoch 0 was not removed
  // after the failure, and no temporary is left.
  EXPECT_EQ(names_in(ck), (std::vector<std::string>{"epoch=0-step=4.ckpt", "epoch=1-step=8.ckpt", "last.ckpt"}));
  const Checkpoint last = TorchCheckpointIO().load_checkpoint(ck + "/last.ckpt");
  EXPECT_EQ(last.at("epoch").toInt(), 0);
  EXPECT_EQ(last.at("global_step").toInt(), 4);
  EXPECT_EQ(TorchCheckpointIO().load_checkpoint(ck + "/epoch=0-step=4.ckpt").at("global_step").toInt(), 4);
  EXPECT_EQ(TorchCheckpointIO().load_checkpoint(ck + "/epoch=1-step=8.ckpt").at("global_step").toInt(), 8);
}

// One process, 8 steps an epoch: save 3, epoch 1's top-1 file, is refused.
// The callback still names epoch 0's files, and a run resumed from
// last.ckpt finishes.
TEST(Faults, RefusedSaveKeepsThePreviousCheckpointWhichResumes) {
  TempDir dir;
  const std::string ck = dir.path + "/ck";
  auto io = std::make_shared<FaultyCheckpointIO>(std::make_shared<TorchCheckpointIO>(), 3, WriteFault::kRefused);
  auto callback = std::make_shared<RecordingModelCheckpoint>(ck, dir.path);
  {
    fulgur::testing::TinyRegression m;
    Trainer t(TrainerOptions().strategy(std::make_shared<SingleDeviceStrategy>(
                                   c10::Device(c10::kCPU), std::make_shared<CPUAccelerator>(), io))
                  .max_epochs(3).default_root_dir(dir.path).enable_progress_bar(false).enable_model_summary(false)
                  .logger(false).callbacks({callback}));
    try {
      t.fit(m, regression_loader());
      FAIL() << "the fit went on after a failed save";
    } catch (const std::runtime_error& e) {
      EXPECT_THAT(e.what(), HasSubstr("save 3 (" + ck + "/epoch=1-step=16.ckpt) refused by the test"));
    }
  }
  EXPECT_EQ(io->saves(), 3);
  EXPECT_THAT(read_file(dir.path + "/rank-0"), HasSubstr("refused by the test"));
  EXPECT_EQ(names_in(ck), (std::vector<std::string>{"epoch=0-step=8.ckpt", "last.ckpt"}));
  EXPECT_EQ(callback->best_model_path(), ck + "/epoch=0-step=8.ckpt");
  EXPECT_EQ(callback->last_model_path(), ck + "/last.ckpt");
  EXPECT_EQ(TorchCheckpointIO().load_checkpoint(ck + "/last.ckpt").at("global_step").toInt(), 8);

  fulgur::testing::TinyRegression resumed;
  Trainer t(TrainerOptions().accelerator("cpu").devices(1).max_epochs(3).default_root_dir(dir.path)
                .enable_progress_bar(false).enable_model_summary(false).logger(false)
                .callbacks({std::make_shared<ModelCheckpoint>(ModelCheckpointOptions().dirpath(ck).save_last(true))}));
  t.fit(resumed, regression_loader(), nullptr, ck + "/last.ckpt");
  EXPECT_EQ(t.global_step(), 24);
  EXPECT_EQ(resumed.losses.size(), 16u);  // epochs 1 and 2 only
}

namespace {

// The same network as the Python snippet below builds with torch.nn.
struct PyNet : torch::nn::Module {
  PyNet() {
    seq = register_module("seq", torch::nn::Sequential(torch::nn::Linear(4, 8), torch::nn::ReLU(),
                                                       torch::nn::Linear(8, 3)));
    bn = register_module("bn", torch::nn::BatchNorm1d(3));
  }
  torch::Tensor forward(const torch::Tensor& x) { return bn->forward(seq->forward(x)); }
  torch::nn::Sequential seq{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
};

const char* kPythonNet = R"(
import sys, torch
torch.set_num_threads(1)
class PyNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.seq = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
        self.bn = torch.nn.BatchNorm1d(3)
    def forward(self, x):
        return self.bn(self.seq(x))
)";

int run_python(const std::string& script, const std::string& dir) {
  const std::string path = dir + "/script.py";
  std::ofstream(path) << kPythonNet << script;
  return std::system(("/usr/bin/python3 " + path + " > " + dir + "/py.out 2>&1").c_str());
}

}  // namespace

TEST(Checkpoint, PythonLoadsOurCheckpointAndGetsTheSameOutputs) {
  TempDir dir;
  torch::manual_seed(5);
  PyNet net;
  {
    torch::NoGradGuard g;
    net.bn->running_mean.copy_(torch::randn({3}));
    net.bn->running_var.copy_(torch::rand({3}) + 0.5);
  }
  net.eval();
  const auto x = torch::linspace(-2, 2, 20).reshape({5, 4});
  const auto y = net.forward(x);
  Checkpoint c = make_dict();
  c.insert("epoch", int64_t{3});
  c.insert("global_step", int64_t{42});
  c.insert("state_dict", state_dict(net));
  TorchCheckpointIO().save_checkpoint(c, dir.path + "/model.ckpt");
  std::ostringstream expected;
  expected.precision(9);
  for (int64_t i = 0; i < y.numel(); ++i) expected << y.flatten()[i].item<double>() << ",";
  const std::string script = R"(
ck = torch.load(sys.argv[0].replace('script.py', 'model.ckpt'))
assert ck['epoch'] == 3 and ck['global_step'] == 42, ck.keys()
net = PyNet()
net.load_state_dict(ck['state_dict'])  # strict: every key present and of the right shape
net.eval()
x = torch.linspace(-2, 2, 20).reshape(5, 4)
expected = torch.tensor([float(v) for v in ')" + expected.str() + R"('.split(',') if v]).reshape(5, 3)
got = net(x)
assert torch.allclose(got, expected, rtol=1e-5, atol=1e-6), (got, expected)
print('python: same outputs')
)";
  ASSERT_EQ(run_python(script, dir.path), 0) << read_file(dir.path + "/py.out");
  EXPECT_THAT(read_file(dir.path + "/py.out"), HasSubstr("python: same outputs"));
}

TEST(Checkpoint, WeLoadAStateDictSavedByPython) {
  TempDir dir;
  const std::string script = R"(
torch.manual_seed(9)
net = PyNet()
with torch.no_grad():
    net.bn.running_mean.copy_(torch.randn(3))
    net.bn.running_var.copy_(torch.rand(3) + 0.5)
net.eval()
torch.save(net.state_dict(), sys.argv[0].replace('script.py', 'py_state.pt'))
y = net(torch.linspace(-2, 2, 20).reshape(5, 4)).flatten()
print(','.join(repr(float(v)) for v in y))
)";
  ASSERT_EQ(run_python(script, dir.path), 0) << read_file(dir.path + "/py.out");
  std::vector<double> expected;
  std::istringstream in(read_file(dir.path + "/py.out"));
  for (std::string v; std::getline(in, v, ',');) expected.push_back(std::stod(v));
  ASSERT_EQ(expected.size(), 15u);

  PyNet net;
  load_from_checkpoint(net, dir.path + "/py_state.pt");
  net.eval();
  const auto y = net.forward(torch::linspace(-2, 2, 20).reshape({5, 4})).flatten();
  for (int64_t i = 0; i < 15; ++i) EXPECT_NEAR(y[i].item<double>(), expected[i], 1e-5) << i;
}

TEST(Resume, TwoWorkersInterruptedAndResumedEndWithTheSameWeights) {
  TempDir dir;
  auto data = [] {
    return std::make_shared<DataLoader>(fulgur::testing::regression_data(96),
                                        DataLoaderOptions(8).shuffle(true).seed(3));
  };
  auto options = [&](const std::string& sub) {
    return TrainerOptions().accelerator("cpu").strategy("ddp").devices(2).default_root_dir(dir.path + sub)
        .enable_progress_bar(false).num_sanity_val_steps(0).seed(11).max_epochs(3);
  };
  auto make = [] {
    torch::manual_seed(2);
    return std::make_shared<fulgur::testing::TinyRegression>(0.05);
  };
  auto full = make();
  Trainer(options("/full").enable_checkpointing(false)).fit(*full, data());

  // 6 batches per worker and epoch: stop at step 8, inside epoch 1.
  auto first = make();
  Trainer t1(options("/parts").max_steps(8).enable_checkpointing(false));
  t1.fit(*first, data());
  t1.save_checkpoint(dir.path + "/mid.ckpt");
  EXPECT_EQ(global_step_of(dir.path + "/mid.ckpt"), 8);
  auto second = make();
  Trainer(options("/parts").enable_checkpointing(false)).fit(*second, data(), nullptr, dir.path + "/mid.ckpt");
  EXPECT_FALSE(torch::equal(first->fc->weight, full->fc->weight));  // the first part alone differs
  EXPECT_TRUE(torch::allclose(second->fc->weight, full->fc->weight, 0, 1e-7)) << second->fc->weight << full->fc->weight;
  EXPECT_TRUE(torch::allclose(second->fc->bias, full->fc->bias, 0, 1e-7));
}

namespace {

// Adds `path` with `score` to the kept top-k paths of the ModelCheckpoint
// state `key` in the checkpoint file `ckpt`, and writes the file back.
void add_kept_path(const std::string& ckpt, const std::string& key, const std::string& path, double score) {
  Checkpoint c = TorchCheckpointIO().load_checkpoint(ckpt);
  auto state = c.at("callbacks").toGenericDict().at(key).toGenericDict();
  state.at("best_k_models").toGenericDict().insert_or_assign(c10::IValue(path), c10::IValue(score));
  TorchCheckpointIO().save_checkpoint(c, ckpt);
}

// The .ckpt files directly in `dir`, by name.
std::set<std::string> ckpt_names(const std::string& dir) {
  std::set<std::string> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".ckpt") out.insert(e.path().filename().string());
  return out;
}

}  // namespace

// Issue 16, item 2: a checkpoint's callback state names files outside the
// callback's folder as its oldest top-k checkpoints (an absolute path, a ".."
// escape, and a path through a symlink to another folder). Resumed by two
// worker processes whose rotation would remove the oldest first, the run drops
// them with a warning and the files survive.
TEST(Security, ResumedCheckpointCannotDeleteFilesOutsideItsFolder) {
  TempDir dir;
  const std::string ck = dir.path + "/ck", outside = dir.path + "/precious";
  fs::create_directories(outside);
  const std::vector<std::string> victims = {outside + "/a.ckpt", outside + "/b.ckpt", outside + "/c.ckpt"};
  for (const auto& v : victims) std::ofstream(v) << "not yours";
  auto callback = [&] {
    return std::make_shared<ModelCheckpoint>(
        ModelCheckpointOptions().dirpath(ck).every_n_train_steps(1).save_top_k(2).save_last(true));
  };
  auto fit = [&](int64_t max_steps, const std::string& ckpt_path) {
    fulgur::testing::TinyRegression m;
    Trainer t(TrainerOptions().accelerator("cpu").strategy("ddp").devices(2).max_steps(max_steps)
                  .default_root_dir(dir.path).enable_progress_bar(false).num_sanity_val_steps(0).logger(false)
                  .callbacks({callback()}));
    t.fit(m, std::make_shared<DataLoader>(fulgur::testing::regression_data(64), DataLoaderOptions(4)), nullptr, ckpt_path);
  };
  fit(2, "");
  const std::string key = callback()->state_key();
  add_kept_path(ck + "/last.ckpt", key, victims[0], -3);
  add_kept_path(ck + "/last.ckpt", key, ck + "/../precious/b.ckpt", -2);
  fs::create_directory_symlink(outside, ck + "/link");
  add_kept_path(ck + "/last.ckpt", key, ck + "/link/c.ckpt", -1);

  ::testing::internal::CaptureStderr();
  fit(6, ck + "/last.ckpt");
  const std::string err = ::testing::internal::GetCapturedStderr();
  for (const auto& v : victims) EXPECT_TRUE(fs::exists(v)) << v << " was deleted by the resumed run";
  for (const auto& named : {victims[0], ck + "/../precious/b.ckpt", ck + "/link/c.ckpt"}) {
    EXPECT_THAT(err, HasSubstr("the top-k checkpoint '" + named + "'"));
  }
  // All three in one line.
  const auto line_start = err.find("ModelCheckpoint: the restored state names");
  ASSERT_NE(line_start, std::string::npos) << err;
  const std::string line = err.substr(line_start, err.find('\n', line_start) - line_start);
  for (const auto& named : {victims[0], ck + "/../precious/b.ckpt", ck + "/link/c.ckpt"}) {
    EXPECT_THAT(line, HasSubstr("'" + named + "'"));
  }
  EXPECT_THAT(line, HasSubstr("which are not inside this callback's folder"));
  EXPECT_EQ(err.find("the restored state names", line_start + line.size()), std::string::npos) << err;
  EXPECT_EQ(ckpt_names(ck), (std::set<std::string>{"epoch=0-step=5.ckpt", "epoch=0-step=6.ckpt", "last.ckpt"}));
}

// Issue 16, item 9: top-k files that a killed run wrote but never recorded
// (the kill came between the save and last.ckpt) are removed on resume, so at
// most save_top_k remain; files of other names in the folder stay.
TEST(Faults, ResumeRemovesTopKFilesTheRestoredStateDoesNotKeep) {
  TempDir dir;
  const std::string ck = dir.path + "/ck";
  auto fit = [&](int64_t max_steps, const std::string& ckpt_path) {
    fulgur::testing::TinyRegression m;
    Trainer t(TrainerOptions().accelerator("cpu").devices(1).max_steps(max_steps).default_root_dir(dir.path)
                  .enable_progress_bar(false).num_sanity_val_steps(0).logger(false)
                  .callbacks({std::make_shared<ModelCheckpoint>(
                      ModelCheckpointOptions().dirpath(ck).every_n_train_steps(1).save_top_k(2).save_last(true))}));
    t.fit(m, std::make_shared<DataLoader>(fulgur::testing::regression_data(64), DataLoaderOptions(4)), nullptr, ckpt_path);
  };
  fit(3, "");
  ASSERT_EQ(ckpt_names(ck), (std::set<std::string>{"epoch=0-step=2.ckpt", "epoch=0-step=3.ckpt", "last.ckpt"}));
  // What earlier killed rounds left: unrecorded top-k files, and files the callback never names.
  for (const std::string name : {"epoch=0-step=7.ckpt", "epoch=0-step=9.ckpt", "epoch=0-step=9-v1.ckpt"}) {
    fs::copy_file(ck + "/epoch=0-step=3.ckpt", ck + "/" + name);
  }
  for (const std::string name : {"notes.ckpt", "epoch=0-step=x.ckpt", "epoch=0-step=8.ckpt.bak"}) std::ofstream(ck + "/" + name) << "mine";
  fit(4, ck + "/last.ckpt");
  EXPECT_EQ(ckpt_names(ck), (std::set<std::string>{"epoch=0-step=3.ckpt", "epoch=0-step=4.ckpt", "last.ckpt", "notes.ckpt",
                                                    "epoch=0-step=x.ckpt"}));
  EXPECT_TRUE(fs::exists(ck + "/epoch=0-step=8.ckpt.bak"));
}

namespace {

// Adam and a StepLR that halves the rate every 2 optimizer steps.
struct Scheduled : fulgur::testing::TinyRegression {
  OptimizerConfig configure_optimizers() override {
    adam = std::make_shared<torch::optim::Adam>(parameters(), torch::optim::AdamOptions(0.08));
    auto s = SchedulerConfig(std::make_shared<torch::optim::StepLR>(*adam, 2, 0.5)).interval("step");
    return OptimizerConfig({adam}, {s});
  }
  double lr() const { return adam->param_groups().at(0).options().get_lr(); }
  std::shared_ptr<torch::optim::Adam> adam;
};

TrainerOptions scheduled_run(const std::string& root, int64_t max_steps) {
  return TrainerOptions().accelerator("cpu").devices(1).max_steps(max_steps).default_root_dir(root)
      .enable_progress_bar(false).num_sanity_val_steps(0).logger(false).enable_checkpointing(false);
}

std::shared_ptr<DataLoader> sixty_four() {
  return std::make_shared<DataLoader>(fulgur::testing::regression_data(64), DataLoaderOptions(4));
}

// Resumes a Scheduled fit (max_steps 20) from `ckpt` in a forked process;
// returns what it threw ("" if it finished), or "still running after
// <seconds> s" (the process is then killed).
std::string resume_in_child(const std::string& ckpt, const std::string& root, double seconds) {
  const std::string report = root + "/child.txt";
  const pid_t pid = ::fork();
  if (pid == 0) {
    std::string error;
    try {
      Scheduled m;
      Trainer(scheduled_run(root, 20)).fit(m, sixty_four(), nullptr, ckpt);
    } catch (const std::exception& e) {
      error = e.what();
    }
    std::ofstream(report) << error;
    ::_exit(0);
  }
  const auto end = Clock::now() + std::chrono::duration<double>(seconds);
  int status = 0;
  while (Clock::now() < end) {
    if (::waitpid(pid, &status, WNOHANG) == pid) return read_file(report);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, &status, 0);
  return "still running after " + std::to_string(seconds) + " s";
}

void set_scheduler_count(const std::string& ckpt, int64_t last_epoch, std::optional<int64_t> global_step = std::nullopt) {
  Checkpoint c = TorchCheckpointIO().load_checkpoint(ckpt);
  auto s = c.at("lr_schedulers").toList().get(0).toGenericDict();
  s.insert_or_assign(c10::IValue("last_epoch"), c10::IValue(last_epoch));
  s.insert_or_assign(c10::IValue("_step_count"), c10::IValue(last_epoch + 1));
  if (global_step) {
    auto loop = c.at("loops").toGenericDict().at("fit_loop").toGenericDict();
    loop.insert_or_assign(c10::IValue("global_step"), c10::IValue(*global_step));
    c.insert_or_assign("global_step", *global_step);
  }
  TorchCheckpointIO().save_checkpoint(c, ckpt);
}

}  // namespace

// Issue 16, item 6: a scheduler count of 10^12 in a checkpoint was replayed
// one step at a time (minutes of spinning). It is refused at once, naming
// the file, the key, the value and the bound.
TEST(Resume, HugeSchedulerCountIsRefusedAtOnce) {
  TempDir dir;
  Scheduled m;
  Trainer t(scheduled_run(dir.path, 3));
  t.fit(m, sixty_four());
  const std::string ckpt = dir.path + "/huge.ckpt";
  t.save_checkpoint(ckpt);
  set_scheduler_count(ckpt, 1'000'000'000'000);
  const auto start = Clock::now();
  std::string error = resume_in_child(ckpt, dir.path, 20);
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 10.0);
  EXPECT_THAT(error, HasSubstr("checkpoint " + ckpt + ": 'lr_schedulers[0].last_epoch' is 1000000000000, outside [0, 3]"));
  EXPECT_THAT(error, HasSubstr("global_step is 3"));

  // The loop position claims as much: the bound is then libtorch's counter width.
  set_scheduler_count(ckpt, 1'000'000'000'000, 1'000'000'000'000);
  error = resume_in_child(ckpt, dir.path, 20);
  EXPECT_THAT(error, HasSubstr("'lr_schedulers[0].last_epoch' is 1000000000000, outside [0, 4294967295]"));

  // A negative count or batch position is refused too.
  set_scheduler_count(ckpt, -1, 3);
  EXPECT_THAT(resume_in_child(ckpt, dir.path, 20), HasSubstr("'lr_schedulers[0].last_epoch' is -1, outside [0, 3]"));
  set_scheduler_count(ckpt, 3);
  {
    Checkpoint c = TorchCheckpointIO().load_checkpoint(ckpt);
    c.at("loops").toGenericDict().at("fit_loop").toGenericDict().insert_or_assign(c10::IValue("batches_done"), c10::IValue(-1));
    TorchCheckpointIO().save_checkpoint(c, ckpt);
  }
  EXPECT_THAT(resume_in_child(ckpt, dir.path, 20), HasSubstr("'loops.fit_loop.batches_done' is -1, outside [0, 16]"));
}

// The scheduler's count is restored directly: after 5 steps, a resume, and 3
// or 4 more, the rate is what an uninterrupted run has, 0.08 * 0.5^((n-1)/2)
// after n steps (libtorch's StepLR halves at its 3rd, 5th, ... step() call).
TEST(Resume, SchedulerCountIsRestoredWithoutReplay) {
  TempDir dir;
  Scheduled a;
  Trainer t(scheduled_run(dir.path, 5));
  t.fit(a, sixty_four());
  EXPECT_DOUBLE_EQ(a.lr(), 0.08 * 0.25);
  t.save_checkpoint(dir.path + "/five.ckpt");
  for (int64_t steps : {8, 9}) {
    Scheduled b;
    Trainer(scheduled_run(dir.path, steps)).fit(b, sixty_four(), nullptr, dir.path + "/five.ckpt");
    Scheduled c;
    Trainer(scheduled_run(dir.path, steps)).fit(c, sixty_four());
    EXPECT_DOUBLE_EQ(b.lr(), 0.08 * std::pow(0.5, (steps - 1) / 2)) << steps << " steps";
    EXPECT_DOUBLE_EQ(b.lr(), c.lr()) << steps << " steps";
  }
}

namespace {

// A port of this process's: a listening socket on loopback that never
// accepts, as another program holding MASTER_PORT would be. The kernel
// completes `backlog` connections to it (a server's usual queue: 128),
// the later ones time out connecting.
struct HeldPort {
  explicit HeldPort(int backlog = 128) {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(fd, backlog) != 0) {
      throw std::runtime_error(std::string("cannot hold a port: ") + std::strerror(errno));
    }
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
    port = ntohs(addr.sin_port);
  }
  ~HeldPort() { ::close(fd); }
  int fd = -1;
  int port = 0;
};

// A loopback port nobody listens on right now.
int unused_port() {
  HeldPort p;
  return p.port;
}

// The MNIST example as rank `rank` of 2 processes started by an outside
// launcher (RANK, WORLD_SIZE, MASTER_PORT set), collective timeout `timeout_s`.
std::unique_ptr<Child> outside_rank(int rank, int port, int timeout_s, const std::string& dir,
                                    const std::string& log_level = "info") {
  const std::string out = dir + "/rank" + std::to_string(rank);
  fs::create_directories(out);
  std::vector<std::string> args = mnist_job(out + "/run", {"--collective-timeout", std::to_string(timeout_s)});
  return std::make_unique<Child>(args, out,
                                 std::vector<std::string>{"RANK=" + std::to_string(rank), "LOCAL_RANK=" + std::to_string(rank),
                                                          "WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1",
                                                          "MASTER_PORT=" + std::to_string(port),
                                                          "FULGUR_LOG_LEVEL=" + log_level});
}

}  // namespace

// Issue 16, item 7: another program holds MASTER_PORT. Rank 0 cannot serve
// the store and says so; rank 1, which reaches the other program's socket
// instead of a store, fails too, within the collective timeout and a few
// seconds (it used to wait without end, or abort on a std::system_error).
TEST(Rendezvous, PortHeldByAnotherProgramFailsBothRanksWithinTheTimeout) {
  TempDir dir;
  HeldPort held;
  const auto start = Clock::now();
  auto rank0 = outside_rank(0, held.port, 4, dir.path);
  auto rank1 = outside_rank(1, held.port, 4, dir.path);
  // The margin covers a loaded machine (CI runs two tests at a time); before the fix it waited without end.
  const int code1 = rank1->wait(4 + 20);
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  const int code0 = rank0->wait(10);
  EXPECT_EQ(code0, 1) << rank0->stderr_text();
  EXPECT_THAT(rank0->stderr_text(), HasSubstr("port " + std::to_string(held.port)));
  ASSERT_NE(code1, -1) << "rank 1 still waits " << seconds << " s after its start:\n" << rank1->stderr_text();
  EXPECT_EQ(code1, 1) << rank1->stderr_text();
  EXPECT_THAT(rank1->stderr_text(), HasSubstr("mnist: error: rendezvous: "));
  EXPECT_THAT(rank1->stderr_text(), HasSubstr("127.0.0.1:" + std::to_string(held.port)));
  std::printf("rank 1 ended after %.1f s:\n%s\n", seconds, rank1->stderr_text().c_str());
}

// The same with fulgur's launcher on two nodes of this machine: node 0
// cannot serve the job's store; node 1's launcher and workers reach the
// other program instead, and node 1 stops within the timeout and a few
// seconds.
TEST(Rendezvous, PortHeldByAnotherProgramStopsTheOtherNodeWithinTheTimeout) {
  TempDir dir;
  HeldPort held;
  std::vector<std::unique_ptr<Child>> nodes;
  const auto start = Clock::now();
  for (int node = 0; node < 2; ++node) {
    const std::string out = dir.path + "/node" + std::to_string(node);
    fs::create_directories(out);
    nodes.push_back(std::make_unique<Child>(
        mnist_job(out + "/run", {"--num-nodes", "2", "--collective-timeout", "4"}), out,
        std::vector<std::string>{"NODE_RANK=" + std::to_string(node), "MASTER_ADDR=127.0.0.1",
                                 "MASTER_PORT=" + std::to_string(held.port)}));
  }
  // The margin covers a loaded machine (CI runs two tests at a time); before the fix it waited without end.
  const int code1 = nodes[1]->wait(4 + 25);
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  EXPECT_NE(nodes[0]->wait(10), 0) << nodes[0]->stderr_text();
  EXPECT_THAT(nodes[0]->stderr_text(), HasSubstr("MASTER_PORT=" + std::to_string(held.port)));
  ASSERT_NE(code1, -1) << "node 1 still runs " << seconds << " s after its start:\n" << nodes[1]->stderr_text();
  EXPECT_NE(code1, 0) << nodes[1]->stderr_text();
  EXPECT_THAT(nodes[1]->stderr_text(), HasSubstr("did not answer within 4000 ms"));
  std::printf("node 1 ended after %.1f s:\n%s\n", seconds, nodes[1]->stderr_text().c_str());
  for (int i = 0; i < 50 && !children_of(nodes[1]->pid).empty(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
}

// Issue 16, item 7: a worker waiting at the rendezvous (timeout: a minute)
// stops within a second or two of SIGTERM or SIGINT, killed by it as
// Lightning's workers are before their handlers are registered: while it
// retries to reach a store nobody serves yet, and while it waits for the
// reply of a program that holds the port.
TEST(Signals, StopSignalEndsAWorkerWaitingAtTheRendezvous) {
  TempDir dir;
  HeldPort held;
  for (const bool silent_peer : {false, true}) {
    for (int sig : {SIGTERM, SIGINT}) {
      const std::string what = std::string(silent_peer ? "held port" : "no store yet") + ", signal " + std::to_string(sig);
      // At debug level every rank prints its cluster-environment line before the rendezvous.
      auto rank1 = outside_rank(1, silent_peer ? held.port : unused_port(), 60, dir.path, "debug");
      const auto end = Clock::now() + std::chrono::seconds(30);
      while (Clock::now() < end && rank1->stderr_text().find("fulgur: ") == std::string::npos) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      ASSERT_NE(rank1->stderr_text().find("fulgur: "), std::string::npos) << what << ": rank 1 did not reach its rendezvous";
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      ::kill(rank1->pid, sig);
      const auto sent = Clock::now();
      const int code = rank1->wait(10);
      const double seconds = std::chrono::duration<double>(Clock::now() - sent).count();
      EXPECT_EQ(code, 128 + sig) << what << ": " << rank1->stderr_text();
      EXPECT_LT(seconds, 2.0) << what << ": " << rank1->stderr_text();
    }
  }
}

namespace {

// Rank 0, the one that writes metrics.csv, is killed at step 105.
struct KilledAtStep105 : fulgur::testing::TinyRegression {
  StepOutput training_step(const Batch& b, int64_t i) override {
    if (trainer()->global_rank() == 0 && trainer()->global_step() == 105) ::raise(SIGKILL);
    return TinyRegression::training_step(b, i);
  }
};

}  // namespace

// metrics.csv is written as the rows come, flushed every 100 steps (Lightning's
// flush_logs_every_n_steps): a SIGKILL loses the rows since the last flush only.
TEST(Faults, SigkilledWriterLeavesTheMetricsUpToTheLastFlush) {
  TempDir dir;
  KilledAtStep105 m;
  Trainer t(TrainerOptions().accelerator("cpu").strategy("ddp").devices(2).max_epochs(10).log_every_n_steps(1)
                .default_root_dir(dir.path).enable_progress_bar(false).enable_checkpointing(false)
                .collective_timeout_ms(20000));
  // 32 steps an epoch: 64 samples per rank in batches of 2.
  auto data = std::make_shared<DataLoader>(fulgur::testing::regression_data(128), DataLoaderOptions(2));
  EXPECT_THROW(t.fit(m, data), WorkerFailure);
  std::istringstream csv(read_file(dir.path + "/lightning_logs/version_0/metrics.csv"));
  std::string header;
  std::getline(csv, header);
  EXPECT_EQ(header, "epoch,train_loss,step");
  std::vector<int64_t> steps;
  for (std::string line; std::getline(csv, line);) steps.push_back(std::stoll(line.substr(line.rfind(',') + 1)));
  ASSERT_EQ(steps.size(), 100u) << "rows of steps 1..100 (flushed at step 100), not those of 101..104";
  for (size_t i = 0; i < steps.size(); ++i) EXPECT_EQ(steps[i], static_cast<int64_t>(i) + 1);
}

// --- Stop signals wherever a worker is (issue 16, item 7) -------------------

TEST(Signals, StopPollAgreesAboutEveryQuarterSecondWhateverABatchCosts) {
  using namespace std::chrono_literals;
  using fulgur::detail::StopPoll;
  int agreements = 0;
  double seen = 0;
  StopPoll poll(
      [&](bool local, double seconds) {
        ++agreements;
        seen = seconds;
        return std::make_pair(local, seconds);
      },
      250ms, StopPoll::Clock::time_point());
  StopPoll::Clock::time_point t;
  // 10 ms batches: the first boundary agrees (and measures), then every 25th.
  for (int i = 1; i <= 101; ++i) EXPECT_FALSE(poll.poll(false, false, t += 10ms)) << i;
  EXPECT_EQ(poll.every(), 25);
  EXPECT_EQ(agreements, 5);  // batches 1, 26, 51, 76, 101
  EXPECT_NEAR(seen, 0.25, 1e-9);
  // A signal at batch 102 is acted on at batch 126, 0.25 s later.
  int batches = 0;
  while (!poll.poll(true, false, t += 10ms)) ++batches;
  EXPECT_EQ(batches, 24);
  // A loop's last batch agrees at once.
  EXPECT_TRUE(poll.poll(true, true, t += 10ms));
  // 2 s batches: every boundary.
  poll.poll(false, true, t += 2s);
  EXPECT_EQ(poll.every(), 1);
  // No time measured (a clock that did not move): the most allowed.
  poll.poll(false, true, t);
  EXPECT_EQ(poll.every(), StopPoll::kMaxEvery);
  // One process: its own flag, at every boundary, without agreeing.
  StopPoll alone(nullptr, 250ms);
  EXPECT_FALSE(alone.poll(false, false));
  EXPECT_TRUE(alone.poll(true, false));
}

namespace {

// Each step appends a line to <dir>/<kind>-<rank>; training step `hang_at`
// of rank `hang_rank` sleeps for a minute; validation steps take `val_ms`.
struct SlowSteps : fulgur::testing::TinyRegression {
  explicit SlowSteps(std::string dir) : dir(std::move(dir)) {}
  void mark(const std::string& kind) {
    std::ofstream(dir + "/" + kind + "-" + std::to_string(trainer()->global_rank()), std::ios::app) << "x\n";
  }
  StepOutput training_step(const Batch& b, int64_t i) override {
    mark("train");
    if (i == hang_at && trainer()->global_rank() == hang_rank) {
      mark("stuck");
      std::this_thread::sleep_for(std::chrono::seconds(60));
    }
    return TinyRegression::training_step(b, i);
  }
  StepOutput validation_step(const Batch& b, int64_t i) override {
    mark("val");
    std::this_thread::sleep_for(std::chrono::milliseconds(val_ms));
    return TinyRegression::validation_step(b, i);
  }
  std::string dir;
  int val_ms = 0;
  int64_t hang_at = -1;
  int64_t hang_rank = 1;
};

int64_t lines_in(const std::string& path) {
  const std::string text = read_file(path);
  return std::count(text.begin(), text.end(), '\n');
}

// Waits until `path` has at least `n` lines; false after `seconds`.
bool wait_for_lines(const std::string& path, int64_t n, double seconds) {
  const auto end = Clock::now() + std::chrono::duration<double>(seconds);
  while (Clock::now() < end) {
    if (lines_in(path) >= n) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

std::shared_ptr<Strategy> two_cpu_workers(std::chrono::milliseconds stop_timeout = std::chrono::seconds(30)) {
  auto po = ParallelOptions()
      .timeout(std::chrono::seconds(90))  // no collective gives up before the signal's effect is seen
      .stop_timeout(stop_timeout);
  return std::make_shared<DDPStrategy>(std::make_shared<CPUAccelerator>(), std::vector<int64_t>{0, 1}, nullptr,
                                       nullptr, po);
}

TrainerOptions stop_options(const std::string& root, std::shared_ptr<Strategy> strategy) {
  return TrainerOptions().strategy(std::move(strategy)).max_epochs(1).default_root_dir(root)
      .enable_progress_bar(false).enable_model_summary(false).num_sanity_val_steps(0);
}

std::shared_ptr<DataLoader> rows(int64_t n) {
  return std::make_shared<DataLoader>(fulgur::testing::regression_data(n), DataLoaderOptions(4));
}

// Runs t.fit on another thread's behalf and returns the WorkerFailure it
// ends with, and when.
struct FitEnd {
  std::optional<WorkerFailure> failure;
  Clock::time_point at;
};
FitEnd fit_until_failure(Trainer& t, LightningModule& m, std::shared_ptr<DataLoader> train,
                         std::shared_ptr<DataLoader> val) {
  FitEnd end;
  try {
    t.fit(m, std::move(train), std::move(val));
  } catch (const WorkerFailure& e) {
    end.failure = e;
  }
  end.at = Clock::now();
  return end;
}

}  // namespace

// 100 validation batches of 100 ms per rank: the signal comes 3 batches in,
// and the job stops within a second or so instead of 10 s later, saving
// last.ckpt and skipping the epoch end of the partial validation.
TEST(Signals, SigtermDuringALongValidationStopsTheJobWithinASecond) {
  TempDir dir;
  SlowSteps m(dir.path);
  m.val_ms = 100;
  Trainer t(stop_options(dir.path + "/run", two_cpu_workers()));
  Clock::time_point sent;
  std::thread signaller([&] {
    if (wait_for_lines(dir.path + "/val-0", 3, 120)) {
      sent = Clock::now();
      ::kill(::getpid(), SIGTERM);  // the launching process, as a scheduler would
    }
  });
  const FitEnd end = fit_until_failure(t, m, rows(64), rows(800));
  signaller.join();
  ASSERT_TRUE(end.failure.has_value()) << "fit ended without the signal's failure";
  EXPECT_EQ(end.failure->exit_code(), 143) << end.failure->what();
  EXPECT_THAT(end.failure->what(), HasSubstr("SIGTERM"));
  const double seconds = std::chrono::duration<double>(end.at - sent).count();
  EXPECT_LT(seconds, 3.0) << "from the signal to the end of the job";
  for (int rank : {0, 1}) EXPECT_LT(lines_in(dir.path + "/val-" + std::to_string(rank)), 40) << "rank " << rank;
  const std::string last = dir.path + "/run/lightning_logs/version_0/checkpoints/last.ckpt";
  ASSERT_TRUE(fs::exists(last));
  EXPECT_EQ(global_step_of(last), 8);  // the epoch's 8 batches, then validation
  // No checkpoint was chosen on the partial validation's metrics.
  for (const auto& e : fs::directory_iterator(fs::path(last).parent_path()))
    EXPECT_EQ(e.path().filename(), "last.ckpt");
}

// A stop signal writes last.ckpt only where checkpointing is on: with
// enable_checkpointing(false), or under fast_dev_run, no file is written and
// the error says so (before, last.ckpt was written whatever the options;
// Lightning writes nothing without a ModelCheckpoint).
namespace {
struct SigtermAtStep3 : fulgur::testing::TinyRegression {
  StepOutput training_step(const Batch& b, int64_t i) override {
    if (global_step() == 3) ::raise(SIGTERM);
    return fulgur::testing::TinyRegression::training_step(b, i);
  }
};

std::vector<std::string> checkpoint_files(const std::string& root) {
  std::vector<std::string> found;
  if (!fs::exists(root)) return found;
  for (const auto& e : fs::recursive_directory_iterator(root))
    if (e.path().extension() == ".ckpt") found.push_back(e.path().string());
  return found;
}
}  // namespace

TEST(Signals, StopWithCheckpointingOffWritesNoCheckpoint) {
  for (const bool dev_run : {false, true}) {
    SCOPED_TRACE(dev_run ? "fast_dev_run(6)" : "enable_checkpointing(false)");
    TempDir dir;
    SigtermAtStep3 m;
    auto options = TrainerOptions().accelerator("cpu").devices(1).max_epochs(1).default_root_dir(dir.path + "/run")
                       .enable_progress_bar(false).enable_model_summary(false).num_sanity_val_steps(0);
    if (dev_run) options.fast_dev_run(6);
    else options.enable_checkpointing(false);
    Trainer t(options);
    ASSERT_EQ(t.checkpoint_callback(), nullptr);
    std::optional<WorkerFailure> failure;
    try {
      t.fit(m, rows(64));
    } catch (const WorkerFailure& e) {
      failure = e;
    }
    ASSERT_TRUE(failure.has_value()) << "fit ended without the signal's failure";
    EXPECT_EQ(failure->exit_code(), 143) << failure->what();
    EXPECT_THAT(failure->what(), HasSubstr("at step 4; no checkpoint written (checkpointing is off)"));
    EXPECT_EQ(checkpoint_files(dir.path), std::vector<std::string>{});
    EXPECT_FALSE(fs::exists("checkpoints/last.ckpt")) << "written to the working folder";
  }
  // The same job with checkpointing on still writes last.ckpt at the stop.
  TempDir dir;
  SigtermAtStep3 m;
  Trainer t(TrainerOptions().accelerator("cpu").devices(1).max_epochs(1).default_root_dir(dir.path)
                .enable_progress_bar(false).enable_model_summary(false).num_sanity_val_steps(0));
  EXPECT_THROW(t.fit(m, rows(64)), WorkerFailure);
  const std::string last = dir.path + "/lightning_logs/version_0/checkpoints/last.ckpt";
  EXPECT_EQ(checkpoint_files(dir.path), std::vector<std::string>{last});
  EXPECT_EQ(global_step_of(last), 4);
}

// A rank stuck in a step cannot reach the next agreement: the launcher
// waits for it, and a second signal ends the job at once.
TEST(Signals, SecondSigtermEndsAJobWithAWorkerStuckInAStep) {
  TempDir dir;
  SlowSteps m(dir.path);
  m.hang_at = 2;
  Trainer t(stop_options(dir.path + "/run", two_cpu_workers()));
  std::atomic<bool> running_after_first{false};
  Clock::time_point second;
  std::atomic<bool> fit_done{false};
  std::thread signaller([&] {
    if (!wait_for_lines(dir.path + "/stuck-1", 1, 120)) return;
    ::kill(::getpid(), SIGTERM);
    std::this_thread::sleep_for(std::chrono::milliseconds(1000));
    running_after_first = !fit_done;
    second = Clock::now();
    ::kill(::getpid(), SIGTERM);
  });
  const FitEnd end = fit_until_failure(t, m, rows(64), nullptr);
  fit_done = true;
  signaller.join();
  ASSERT_TRUE(end.failure.has_value());
  EXPECT_TRUE(running_after_first) << "the first signal gives the workers stop_timeout (30 s) to stop";
  EXPECT_LT(std::chrono::duration<double>(end.at - second).count(), 2.0) << "from the second signal to the end";
  EXPECT_THAT(end.failure->what(), HasSubstr("a second signal killed the workers"));
}

// One signal, and a worker that never reaches a batch boundary: SIGKILL after
// the launcher's stop_timeout.
TEST(Signals, WorkerStuckInAStepIsKilledStopTimeoutAfterTheSignal) {
  TempDir dir;
  SlowSteps m(dir.path);
  m.hang_at = 2;
  Trainer t(stop_options(dir.path + "/run", two_cpu_workers(std::chrono::milliseconds(1500))));
  Clock::time_point sent;
  std::thread signaller([&] {
    if (!wait_for_lines(dir.path + "/stuck-1", 1, 120)) return;
    sent = Clock::now();
    ::kill(::getpid(), SIGTERM);
  });
  const FitEnd end = fit_until_failure(t, m, rows(64), nullptr);
  signaller.join();
  ASSERT_TRUE(end.failure.has_value());
  const double seconds = std::chrono::duration<double>(end.at - sent).count();
  EXPECT_GT(seconds, 1.4);
  EXPECT_LT(seconds, 4.0);
  EXPECT_THAT(end.failure->what(), HasSubstr("(stop_timeout) were killed"));
}

// A process on its own (no launcher) stuck in a step: a second SIGINT ends it
// at once with 130, the first having asked for a clean stop.
TEST(Signals, SecondSigintEndsASingleProcessAtOnce) {
  TempDir dir;
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    SlowSteps m(dir.path);
    m.hang_at = 1;
    m.hang_rank = 0;
    Trainer t(TrainerOptions().accelerator("cpu").devices(1).max_epochs(1).default_root_dir(dir.path + "/run")
                  .enable_progress_bar(false).enable_model_summary(false).logger(false));
    try {
      t.fit(m, rows(64));
    } catch (...) {
    }
    ::_exit(0);
  }
  ASSERT_TRUE(wait_for_lines(dir.path + "/stuck-0", 1, 120));
  ::kill(pid, SIGINT);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  int status = 0;
  EXPECT_EQ(::waitpid(pid, &status, WNOHANG), 0) << "the first SIGINT waits for the step to end";
  const auto second = Clock::now();
  ::kill(pid, SIGINT);
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - second).count(), 1.0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 130);
}

namespace {

// SGD with a StepLR stepped per epoch (halving every 2 epochs); rank 0 writes each epoch's
// starting rate to `lr_log`.
struct EpochScheduled : fulgur::testing::TinyRegression {
  explicit EpochScheduled(std::string log) : lr_log(std::move(log)) {}
  OptimizerConfig configure_optimizers() override {
    sgd = std::make_shared<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.1));
    return OptimizerConfig({sgd}, {SchedulerConfig(std::make_shared<torch::optim::StepLR>(*sgd, 2, 0.5))});
  }
  void on_train_epoch_start() override {
    if (trainer()->is_global_zero())
      std::ofstream(lr_log, std::ios::app) << current_epoch() << " " << sgd->param_groups()[0].options().get_lr() << "\n";
  }
  std::string lr_log;
  std::shared_ptr<torch::optim::SGD> sgd;
};

// Fits to `max_epochs` (from `ckpt` if given) with last.ckpt in `dir`/ck; returns the parameters.
torch::Tensor fit_epochs(const std::string& dir, const std::string& lr_log, int64_t devices, int64_t max_epochs,
                         const std::string& ckpt) {
  torch::manual_seed(3);
  EpochScheduled m(lr_log);
  Trainer t(TrainerOptions().accelerator("cpu").devices(devices).strategy(devices > 1 ? "ddp" : "auto")
                .max_epochs(max_epochs).default_root_dir(dir).enable_progress_bar(false).num_sanity_val_steps(0)
                .logger(false).callbacks({std::make_shared<ModelCheckpoint>(
                    ModelCheckpointOptions().dirpath(dir + "/ck").save_last(true))}));
  auto data = [] { return std::make_shared<DataLoader>(fulgur::testing::regression_data(32), DataLoaderOptions(4)); };
  t.fit(m, data(), data(), ckpt);
  std::vector<torch::Tensor> flat;
  for (const auto& p : m.parameters()) flat.push_back(p.detach().reshape({-1}));
  return torch::cat(flat);
}

}  // namespace

// Issue 32, A1: last.ckpt is written at validation end, before the epoch's scheduler step, and
// the resumed run did not take that step: its rate stayed one step behind. Fit 6 epochs, and 3 +
// a resume to 6: every epoch starts at the same rate and the parameters end the same, on one
// process and on two.
TEST(Resume, APerEpochScheduleContinuesExactlyAsTheUninterruptedRun) {
  // Two forked workers first: with a CUDA libtorch on a GPU machine, a process that ran a
  // backward cannot fork workers that run one.
  for (const int64_t devices : {2, 1}) {
    SCOPED_TRACE("devices " + std::to_string(devices));
    TempDir full, part;
    const torch::Tensor want = fit_epochs(full.path, full.path + "/lr.txt", devices, 6, "");
    fit_epochs(part.path, part.path + "/lr.txt", devices, 3, "");
    const torch::Tensor got = fit_epochs(part.path, part.path + "/lr.txt", devices, 6, part.path + "/ck/last.ckpt");
    EXPECT_EQ(read_file(part.path + "/lr.txt"), read_file(full.path + "/lr.txt"));
    // libtorch's StepLR(2) halves at its 3rd, 5th, ... step() (Python's one epoch earlier).
    EXPECT_EQ(read_file(full.path + "/lr.txt"), "0 0.1\n1 0.1\n2 0.1\n3 0.05\n4 0.05\n5 0.025\n")
        << "the uninterrupted run's schedule";
    EXPECT_TRUE(torch::allclose(got, want, 1e-6, 1e-7)) << got << "\n" << want;
  }
}
