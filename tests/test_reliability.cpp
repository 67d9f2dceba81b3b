// Faults injected for real (../shared/spec/reliability.md): signals sent to a
// running job, a parent killed under its workers, processes killed while they
// write checkpoints, the sockets and folders of a running job, and the
// checkpoint format read and written by Python's torch.

#include "support.h"

#include <fulgur/plugins/io/checkpoint_io.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

extern char** environ;

using namespace fulgur;
using fulgur::testing::read_file;
using fulgur::testing::TempDir;
using ::testing::HasSubstr;
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
