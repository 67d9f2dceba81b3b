// SPDX-License-Identifier: Apache-2.0
// Strategies over real worker processes started by the launcher.

#include "support.h"

#include "runtime/log.h"
#include "runtime/threads.h"

#include <fulgur/accelerators/accelerator.h>
#include <fulgur/callbacks/model_checkpoint.h>
#include <fulgur/plugins/io/checkpoint_io.h>
#include <fulgur/data/data_loader.h>
#include <fulgur/launchers/launcher.h>
#include <fulgur/lightning_module.h>
#include <fulgur/strategies/ddp.h>
#include <fulgur/strategies/registry.h>
#include <fulgur/strategies/single_device.h>
#include <fulgur/strategies/xla.h>


#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

using namespace fulgur;
using fulgur::testing::regression_data;
using fulgur::testing::TempDir;
using fulgur::testing::TinyRegression;

namespace {

TrainerOptions opts(const std::string& root, const std::string& accelerator, const std::string& strategy, int devices) {
  return TrainerOptions()
      .accelerator(accelerator)
      .strategy(strategy)
      .devices(devices)
      .default_root_dir(root)
      .enable_progress_bar(false)
      .num_sanity_val_steps(0)
      .collective_timeout_ms(20000);
}

std::shared_ptr<DataLoader> loader(int64_t n, int64_t batch) {
  return std::make_shared<DataLoader>(regression_data(n), DataLoaderOptions(batch).shuffle(true).seed(4));
}

// The pid of the process that ran the test body last: a forked worker
// inherits its parent's value, a re-executed (spawned) worker ran the body
// itself and holds its own pid.
pid_t g_test_body_pid = 0;

void check(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error("in worker: " + what);
}

// Checks, inside the workers, the collectives the seed lists and that every
// rank holds identical parameters at the end.
struct Checked : TinyRegression {
  explicit Checked(std::string start_method) : start_method(std::move(start_method)) {}
  std::string start_method;
  StepOutput training_step(const Batch& b, int64_t i) override {
    auto out = TinyRegression::training_step(b, i);
    log("loss_mean", out.loss(), LogOptions().sync_dist(true));
    return out;
  }
  void on_fit_start() override {
    Strategy& s = trainer()->strategy();
    const int64_t n = s.world_size();
    const double r = static_cast<double>(s.global_rank());
    check(n == trainer()->world_size() && n > 1, "world size after launch");
    check(start_method == "spawn" ? g_test_body_pid == getpid() : g_test_body_pid == getppid(),
          "the worker was started by " + start_method);
    // On the strategy's device: xla devices are lazy tensors, which reduce and all_gather's
    // backward update in place (libtorch 1.13 read a detached row of such a tensor as all of it).
    const c10::Device dev = s.root_device();
    auto sum = s.reduce(torch::tensor(r).to(dev), "sum");
    check(sum.device() == dev && sum.item<double>() == n * (n - 1) / 2.0, "reduce sum");
    check(s.reduce(torch::tensor(r).to(dev), "AVG").item<double>() == (n - 1) / 2.0, "reduce avg");
    check(s.reduce(torch::tensor(r).to(dev), "max").item<double>() == n - 1, "reduce max");
    check(s.Strategy::reduce(c10::IValue(std::string("text")), "sum").toStringRef() == "text", "non-tensor passes");
    // A dict holding a tensor is not a tensor: returned as it is, the tensor not reduced
    // (strategy.h, the GUIDE).
    c10::Dict<std::string, at::Tensor> own;
    own.insert("r", torch::tensor(r));
    const c10::IValue kept = s.Strategy::reduce(c10::IValue(own), "sum");
    check(kept.isGenericDict() && kept.toGenericDict().at("r").toTensor().item<double>() == r, "a dict passes unreduced");
    auto g = s.all_gather(torch::full({2}, r).to(dev));
    check(g.sizes() == c10::IntArrayRef({n, 2}), "all_gather shape");
    // sync_grads: d/dx_r of sum_k w_k * gathered_k, summed over ranks = n * w_r.
    for (const c10::Device d : {c10::Device(torch::kCPU), dev}) {
      auto x = torch::full({2}, r + 1).to(d).requires_grad_();
      auto gathered = s.all_gather(x, true);
      auto w = torch::arange(1, n + 1, torch::kFloat32).view({n, 1}).to(d);
      (gathered * w).sum().backward();
      check(x.grad().sizes() == c10::IntArrayRef({2}) &&
                torch::allclose(x.grad().cpu(), torch::full({2}, static_cast<float>(n * (r + 1)))),
            "all_gather sync_grads on " + d.str());
    }
    auto b = s.broadcast(c10::IValue(std::string(static_cast<size_t>(r) + 1, 'x')), 1);
    check(b.toStringRef() == "xx", "broadcast from rank 1");
    s.barrier("fit-start");
  }
  void on_fit_end() override {
    std::vector<torch::Tensor> flat;
    for (auto& p : parameters()) flat.push_back(p.detach().to(torch::kCPU).reshape({-1}));
    auto all = trainer()->strategy().all_gather(torch::cat(flat));
    for (int64_t r = 1; r < all.size(0); ++r) check(torch::equal(all[0], all[r]), "parameters identical on every rank");
  }
};

torch::Tensor flat_params(torch::nn::Module& m) {
  std::vector<torch::Tensor> flat;
  for (auto& p : m.parameters()) flat.push_back(p.detach().reshape({-1}));
  return torch::cat(flat);
}

void expect_same_training(const std::string& accelerator, const std::string& strategy, const std::string& start) {
  TempDir dir;
  g_test_body_pid = getpid();
  torch::manual_seed(0);
  Checked two(start);
  torch::manual_seed(0);
  TinyRegression one;
  auto before = flat_params(two);
  Trainer t2(opts(dir.path, accelerator, strategy, 2).max_epochs(2).start_method(start).enable_checkpointing(false));
  t2.fit(two, loader(64, 4));
  Trainer t1(opts(dir.path, accelerator, strategy == "xla" ? "single_xla" : "single_device", 1).max_epochs(2)
                 .enable_checkpointing(false));
  t1.fit(one, loader(64, 8));
  EXPECT_FALSE(torch::equal(before, flat_params(two))) << "rank 0's weights came back to the caller";
  EXPECT_TRUE(torch::allclose(flat_params(two), flat_params(one), 1e-5, 1e-6))
      << flat_params(two) << "\n" << flat_params(one);
  EXPECT_EQ(t2.global_step(), 16);
  EXPECT_NEAR(t2.callback_metrics().at("loss_mean"), one.losses.back(), 1e-5);
}

// Issue 35, item 4: with DDP's bf16_compress_hook (gradients summed in bfloat16, averaged in
// float32), 2 workers end within bfloat16's precision of one worker with twice the batch, but
// not within float32's (the hook acted), and with identical parameters on every rank (Checked).
void expect_bf16_hook_training(const std::string& accelerator, const std::string& strategy) {
  TempDir dir;
  g_test_body_pid = getpid();
  torch::manual_seed(0);
  Checked two("fork");
  torch::manual_seed(0);
  TinyRegression one;
  auto hooked = make_strategy(StrategyRequest()
                                  .strategy(strategy)
                                  .accelerator(accelerator)
                                  .devices("2")
                                  .collective_timeout(std::chrono::milliseconds(20000))
                                  .ddp_comm_hook(DDPCommHook::kBf16Compress));
  Trainer t2(opts(dir.path, accelerator, strategy, 2).strategy(hooked).max_epochs(2).enable_checkpointing(false));
  t2.fit(two, loader(64, 4));
  // The reference on cpu, also for xla: PJRT started in this process would refuse later forks.
  Trainer t1(opts(dir.path, "cpu", "single_device", 1).max_epochs(2).enable_checkpointing(false));
  t1.fit(one, loader(64, 8));
  EXPECT_TRUE(torch::allclose(flat_params(two), flat_params(one), 1e-2, 1e-3))
      << flat_params(two) << "\n" << flat_params(one);
  EXPECT_FALSE(torch::allclose(flat_params(two), flat_params(one), 1e-5, 1e-6)) << "the gradients were not compressed";
}

}  // namespace

TEST(Strategies, DdpBf16CompressHookTrainsWithinBfloat16OfOneWorker) { expect_bf16_hook_training("cpu", "ddp"); }

TEST(Strategies, XlaBf16CompressHookTrainsWithinBfloat16OfOneWorker) { expect_bf16_hook_training("xla", "xla"); }

TEST(Strategies, XlaTwoWorkersMatchOneWorkerWithTwiceTheBatch) { expect_same_training("xla", "xla", "fork"); }

TEST(Strategies, DdpTwoWorkersMatchOneWorkerWithTwiceTheBatch) { expect_same_training("cpu", "ddp", "fork"); }

TEST(Strategies, SpawnStartMethodReExecutesTheProgram) { expect_same_training("xla", "xla", "spawn"); }

TEST(Strategies, FitTwiceIsRefused) {
  TempDir dir;
  TinyRegression m;
  Trainer t(opts(dir.path, "xla", "xla", 2).max_steps(1).enable_checkpointing(false));
  t.fit(m, loader(32, 4));
  try {
    t.fit(m, loader(32, 4));
    FAIL();
  } catch (const std::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("second time"), std::string::npos) << e.what();
  }
}

// A stage's error reaches the caller even when the strategy's teardown, which runs while it
// unwinds, fails as well (a module whose values a failed device execution never produced cannot
// move back): the teardown's error is logged, and the process does not end in std::terminate.
// Without a stage error, the teardown's own error reaches the caller.
TEST(Strategies, AStageErrorIsRaisedWhenTheTeardownFailsToo) {
  struct FailingTeardown : SingleDeviceStrategy {
    using SingleDeviceStrategy::SingleDeviceStrategy;
    void teardown() override {
      SingleDeviceStrategy::teardown();
      throw std::runtime_error("teardown broke");
    }
  };
  struct Throws : TinyRegression {
    bool fail = true;
    StepOutput training_step(const Batch& b, int64_t i) override {
      if (fail && trainer()->global_step() == 1) throw std::runtime_error("boom at step 1");
      return TinyRegression::training_step(b, i);
    }
  };
  for (bool fail : {true, false}) {
    TempDir dir;
    Throws m;
    m.fail = fail;
    Trainer t(TrainerOptions()
                  .strategy(std::make_shared<FailingTeardown>(c10::Device("cpu"), std::make_shared<CPUAccelerator>()))
                  .default_root_dir(dir.path)
                  .max_steps(3)
                  .enable_progress_bar(false)
                  .enable_checkpointing(false));
    ::testing::internal::CaptureStderr();
    std::string error;
    try {
      t.fit(m, loader(32, 4));
    } catch (const std::runtime_error& e) {
      error = e.what();
    }
    const std::string err = ::testing::internal::GetCapturedStderr();
    if (fail) {
      EXPECT_EQ(error, "boom at step 1");
      EXPECT_NE(err.find("the strategy's teardown after the stage's error failed as well: teardown broke"),
                std::string::npos)
          << err;
    } else {
      EXPECT_EQ(error, "teardown broke");
    }
  }
}

// Rank `bad` fails at step 3: by throwing, or by SIGKILL.
struct Faulty : TinyRegression {
  Faulty(int bad, bool kill) : bad(bad), kill(kill) {}
  StepOutput training_step(const Batch& b, int64_t i) override {
    if (trainer()->global_rank() == bad && trainer()->global_step() == 3) {
      if (kill) std::raise(SIGKILL);
      throw std::runtime_error("boom at step 3");
    }
    return TinyRegression::training_step(b, i);
  }
  int bad;
  bool kill;
};

TEST(Launcher, ThrowingRankStopsTheJobAndIsNamed) {
  TempDir dir;
  setenv("XLA_NUM_DEVICES", "4", 1);
  Faulty m(2, false);
  Trainer t(opts(dir.path, "xla", "xla", 4).max_epochs(5).enable_checkpointing(false));
  unsetenv("XLA_NUM_DEVICES");
  const auto start = std::chrono::steady_clock::now();
  try {
    t.fit(m, loader(256, 4));
    FAIL();
  } catch (const WorkerFailure& e) {
    EXPECT_EQ(e.rank(), 2) << e.what();
    EXPECT_NE(std::string(e.what()).find("rank 2"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("boom at step 3"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 15.0);
  EXPECT_TRUE(fulgur::testing::processes_matching("test_strategies").empty());
}

TEST(Launcher, KilledRankIsReportedWithItsSignal) {
  TempDir dir;
  Faulty m(1, true);
  Trainer t(opts(dir.path, "cpu", "ddp", 2).max_epochs(5).enable_checkpointing(false));
  try {
    t.fit(m, loader(256, 4));
    FAIL();
  } catch (const WorkerFailure& e) {
    EXPECT_EQ(e.rank(), 1) << e.what();
    EXPECT_NE(std::string(e.what()).find("SIGKILL"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(fulgur::testing::processes_matching("test_strategies").empty());
}

namespace {

// Rank 1 SIGKILLs itself at step 5 (after five optimizer steps), the first
// time only: it leaves `marker` behind before the signal, so a restarted
// worker (a new process of the same program) goes on. always: every time.
struct KilledAtStep5 : TinyRegression {
  KilledAtStep5(std::string marker, bool always) : marker(std::move(marker)), always(always) {}
  StepOutput training_step(const Batch& b, int64_t i) override {
    if (trainer()->global_rank() == 1 && trainer()->global_step() == 5 && (always || !std::filesystem::exists(marker))) {
      std::ofstream(marker) << "killed at step 5\n";
      std::raise(SIGKILL);
    }
    return TinyRegression::training_step(b, i);
  }
  std::string marker;
  bool always;
};

// 2 ddp workers, 2 epochs of 8 steps each; last.ckpt every 2 steps in `ck`.
TrainerOptions restartable(const std::string& root, int64_t max_restarts) {
  auto ckpt = std::make_shared<ModelCheckpoint>(
      ModelCheckpointOptions().dirpath(root + "/ck").save_top_k(0).save_last(true).every_n_train_steps(2));
  return opts(root, "cpu", "ddp", 2).max_epochs(2).seed(11).max_restarts(max_restarts).callbacks({ckpt});
}

at::Tensor saved(const std::string& ckpt, const std::string& key) {
  Checkpoint c = TorchCheckpointIO().load_checkpoint(ckpt);
  return c10::impl::toTypedDict<std::string, c10::IValue>(c.at("state_dict").toGenericDict()).at(key).toTensor();
}

}  // namespace

// Issue 32, item D13: rank 1 of a 2-worker ddp fit is SIGKILLed at step 5.
// With max_restarts(1) the launcher stops rank 0, says why and which attempt
// failed, and starts both again; they resume from the last.ckpt of step 4 and
// end with exactly the parameters of a run that was never interrupted (in the
// caller's module and in the last checkpoint each run saved).
TEST(Launcher, KilledWorkerIsRestartedFromLastCkptAndEndsBitIdentical) {
  TempDir dir;
  const std::string marker = dir.path + "/killed";
  torch::manual_seed(2);
  KilledAtStep5 uninterrupted(dir.path + "/never", false);
  std::ofstream(dir.path + "/never") << "never killed\n";
  Trainer(restartable(dir.path + "/full", 0)).fit(uninterrupted, loader(128, 8));

  torch::manual_seed(2);
  KilledAtStep5 restarted(marker, false);
  Trainer t(restartable(dir.path + "/restarted", 1));
  ::testing::internal::CaptureStderr();
  t.fit(restarted, loader(128, 8));
  const std::string err = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(std::filesystem::exists(marker)) << "rank 1 was never killed";
  EXPECT_NE(err.find("attempt 1 of 2 failed: worker rank 1 failed first: it was killed by SIGKILL"), std::string::npos) << err;
  EXPECT_NE(err.find("starting them again (restart 1 of 1"), std::string::npos) << err;
  EXPECT_NE(err.find("restart 1 of the launch: resuming from " + dir.path + "/restarted/ck/last.ckpt"), std::string::npos)
      << err;
  EXPECT_EQ(t.global_step(), 16);
  EXPECT_TRUE(torch::equal(restarted.fc->weight, uninterrupted.fc->weight))
      << restarted.fc->weight << uninterrupted.fc->weight;
  EXPECT_TRUE(torch::equal(restarted.fc->bias, uninterrupted.fc->bias));
  for (const char* key : {"fc.weight", "fc.bias"}) {
    EXPECT_TRUE(torch::equal(saved(dir.path + "/restarted/ck/last.ckpt", key), saved(dir.path + "/full/ck/last.ckpt", key)))
        << key;
  }
  EXPECT_TRUE(fulgur::testing::processes_matching("test_strategies").empty());
}

// The restart fails the same way: the final report lists both attempts' root
// causes, and no worker is left.
TEST(Launcher, FailureAfterTheLastRestartListsEveryAttempt) {
  TempDir dir;
  KilledAtStep5 m(dir.path + "/killed", true);
  Trainer t(restartable(dir.path, 1));
  ::testing::internal::CaptureStderr();
  try {
    t.fit(m, loader(128, 8));
    ::testing::internal::GetCapturedStderr();
    FAIL() << "the fit did not fail";
  } catch (const WorkerFailure& e) {
    const std::string err = ::testing::internal::GetCapturedStderr();
    const std::string what = e.what();
    EXPECT_EQ(e.rank(), 1) << what;
    EXPECT_EQ(what.rfind("the job failed on each of its 2 attempts (max_restarts=1):", 0), 0u) << what;
    EXPECT_NE(what.find("\n  attempt 1: worker rank 1 failed first: it was killed by SIGKILL"), std::string::npos) << what;
    EXPECT_NE(what.find("\n  attempt 2: worker rank 1 failed first: it was killed by SIGKILL"), std::string::npos) << what;
    EXPECT_NE(err.find("restart 1 of the launch: resuming from " + dir.path + "/ck/last.ckpt"), std::string::npos) << err;
  }
  EXPECT_TRUE(fulgur::testing::processes_matching("test_strategies").empty());
}

TEST(Launcher, NegativeMaxRestartsIsRefusedNamingTheValue) {
  try {
    DDPStrategy(std::make_shared<CPUAccelerator>(), {0, 1}, nullptr, nullptr, ParallelOptions().max_restarts(-1));
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("max_restarts=-1 is negative"), std::string::npos) << e.what();
  }
  try {
    Trainer(TrainerOptions().accelerator("cpu").devices(1).max_restarts(2));
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("max_restarts=2 starts the worker processes of a job again, but strategy "
                                         "'single_device' runs in this process"),
              std::string::npos)
        << e.what();
  }
}

// Writes go through this IO, which records which rank wrote.
struct RecordingIO : XLACheckpointIO {
  explicit RecordingIO(std::string log) : log(std::move(log)) {}
  void save_checkpoint(const Checkpoint& c, const std::string& path, const StorageOptions& o) override {
    std::ofstream(log, std::ios::app) << getenv("RANK") << "\n";
    XLACheckpointIO::save_checkpoint(c, path, o);
  }
  std::string log;
};

TEST(Strategies, CheckpointIsWrittenOnceByRankZeroWithCpuTensors) {
  TempDir dir;
  auto strategy = std::make_shared<XLAStrategy>(std::vector<int64_t>{0, 1},
                                                std::make_shared<RecordingIO>(dir.path + "/writes.txt"));
  TinyRegression m;
  auto ckpt = std::make_shared<ModelCheckpoint>(ModelCheckpointOptions().dirpath(dir.path + "/ck"));
  Trainer t(TrainerOptions().strategy(strategy).max_epochs(1).default_root_dir(dir.path)
                .enable_progress_bar(false).callbacks({ckpt}));
  t.fit(m, loader(32, 4));
  std::ifstream in(dir.path + "/writes.txt");
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  EXPECT_EQ(lines, (std::vector<std::string>{"0"}));
  EXPECT_EQ(ckpt->best_model_path(), dir.path + "/ck/epoch=0-step=4.ckpt");
  Checkpoint c = TorchCheckpointIO().load_checkpoint(ckpt->best_model_path());
  auto sd = c10::impl::toTypedDict<std::string, c10::IValue>(c.at("state_dict").toGenericDict());
  EXPECT_TRUE(sd.at("fc.weight").toTensor().device().is_cpu());
  TinyRegression loaded;
  load_from_checkpoint(loaded, ckpt->best_model_path());
  EXPECT_TRUE(torch::equal(loaded.fc->weight, m.fc->weight));
}

namespace {

// Runs at every training batch: an op big enough for libtorch to run it in an
// OpenMP parallel region when the worker has more than one thread (a region
// written here would not be one: this file is not built with OpenMP), and
// writes the worker's thread count and the op's result.
struct ParallelOpEachBatch : Callback {
  explicit ParallelOpEachBatch(std::string path) : path(std::move(path)) {}
  std::string state_key() const override { return "ParallelOpEachBatch"; }
  void on_train_batch_end(Trainer&, LightningModule&, const StepOutput&, const Batch&, int64_t) override {
    const double sum = torch::ones({1 << 22}).mul(2).sum().item<double>();
    std::ofstream(path) << at::get_num_threads() << " " << static_cast<int64_t>(sum);
  }
  std::string path;
};

}  // namespace

namespace {

// Writes "<intra-op threads> <OMP_NUM_THREADS> <OMP_WAIT_POLICY>" of this
// worker to <dir>/rank-<R> at its first batch.
struct RecordThreads : Callback {
  explicit RecordThreads(std::string dir) : dir(std::move(dir)) {}
  std::string state_key() const override { return "RecordThreads"; }
  void on_train_batch_end(Trainer& t, LightningModule&, const StepOutput&, const Batch&, int64_t) override {
    const char* n = std::getenv("OMP_NUM_THREADS");
    const char* wait = std::getenv("OMP_WAIT_POLICY");
    std::ofstream(dir + "/rank-" + std::to_string(t.global_rank()))
        << at::get_num_threads() << " " << (n ? n : "unset") << " " << (wait ? wait : "unset");
  }
  std::string dir;
};

}  // namespace

// Issue 32, item C10: OMP_NUM_THREADS and OMP_WAIT_POLICY set by the user are
// kept in the workers and followed (as Lightning sets them only when unset);
// unset, each of 2 workers gets half the cores and passive waiting.
TEST(Launcher, UserThreadSettingsAreKeptInTheWorkers) {
  TempDir dir;
  auto fit_recording = [&](const std::string& sub) {
    std::filesystem::create_directories(dir.path + "/" + sub);
    TinyRegression m;
    Trainer t(opts(dir.path, "cpu", "ddp", 2).max_steps(1).enable_checkpointing(false).logger(false).callbacks(
        {std::make_shared<RecordThreads>(dir.path + "/" + sub)}));
    t.fit(m, loader(32, 8));
  };
  setenv("OMP_NUM_THREADS", "7", 1);
  setenv("OMP_WAIT_POLICY", "ACTIVE", 1);
  fit_recording("user");
  unsetenv("OMP_NUM_THREADS");
  unsetenv("OMP_WAIT_POLICY");
  fit_recording("default");
  const std::string half = std::to_string(std::max<int64_t>(1, fulgur::runtime::available_cores() / 2));
  for (const char* rank : {"rank-0", "rank-1"}) {
    EXPECT_EQ(fulgur::testing::read_file(dir.path + "/user/" + rank), "7 7 ACTIVE") << rank;
    EXPECT_EQ(fulgur::testing::read_file(dir.path + "/default/" + rank), half + " " + half + " PASSIVE") << rank;
  }
}

// GNU OpenMP's thread pool does not survive fork: a forked worker's first
// parallel region used to hang when the launching process had run one before
// fit. The scenario runs in a child of the test, which is killed after 60 s.
TEST(Launcher, ForkedWorkerRunsParallelOpsAfterTheParentDid) {
  if (fulgur::runtime::available_cores() < 2) GTEST_SKIP() << "needs 2 cores for a worker with 2 threads (has " << fulgur::runtime::available_cores() << ")";
  TempDir dir;
  const std::string record = dir.path + "/threads";
  const pid_t pid = ::fork();
  if (pid == 0) {
    int code = 1;
    try {
      at::set_num_threads(2);
      const double before = torch::ones({1 << 22}).mul(2).sum().item<double>();  // starts this process's pool
      TinyRegression m;
      Trainer t(opts(dir.path, "cpu", "ddp", 1).max_steps(3).enable_checkpointing(false).logger(false).callbacks(
          {std::make_shared<ParallelOpEachBatch>(record)}));
      t.fit(m, loader(64, 8));
      code = before == 8388608.0 ? 0 : 2;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "scenario failed: %s\n", e.what());
    }
    ::_exit(code);
  }
  int status = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);  // its workers follow (PDEATHSIG)
      ::waitpid(pid, &status, 0);
      FAIL() << "the forked worker hung (60 s) after the launching process ran a parallel op";
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  // One worker on this machine gets every core the process may use (runtime/threads.h).
  const int64_t threads = fulgur::runtime::available_cores();
  EXPECT_EQ(fulgur::testing::read_file(record), std::to_string(threads) + " 8388608")
      << "the worker ran its parallel op with " << threads << " threads";
}

namespace {

// Checks all_gather(x, sync_grads=true) in the workers. On rank q, x is
// (q+1)*ones(2) on the strategy's device and the loss is
// (q+1) * sum_k (k+1) * sum(gathered[k]). Its gradient for row k is
// (q+1)(k+1); the backward sums, over q, what flows into this rank's row r:
// x.grad = (r+1) * (1 + ... + N) = (r+1) N(N+1)/2. N=2: rank 0 gets 3, rank 1
// gets 6; N=3: 6, 12, 18. The gathered values are also checked: row k = k+1.
struct GatherGrads : TinyRegression {
  void on_fit_start() override {
    Strategy& s = trainer()->strategy();
    const int64_t n = s.world_size();
    const double r = static_cast<double>(s.global_rank());
    const c10::Device dev = s.root_device();
    auto x = torch::full({2}, r + 1, torch::TensorOptions().device(dev).requires_grad(true));
    auto gathered = s.all_gather(x, true);
    check(gathered.sizes() == c10::IntArrayRef({n, 2}), "gathered shape");
    check(gathered.device() == dev, "gathered on " + gathered.device().str());
    auto rows = torch::arange(1, n + 1, torch::kFloat32).view({n, 1});
    check(torch::equal(gathered.detach().to(torch::kCPU), rows.expand({n, 2})), "gathered rows are k+1");
    ((gathered * rows.to(dev)).sum() * (r + 1)).backward();
    const at::Tensor grad = x.grad().to(torch::kCPU).contiguous();
    const double want = (r + 1) * n * (n + 1) / 2.0;
    std::ostringstream got;
    got << "shape " << grad.sizes() << ", numel of storage " << grad.storage().nbytes() / sizeof(float) << ", data";
    for (int64_t i = 0; i < grad.numel(); ++i) got << " " << grad.data_ptr<float>()[i];
    check(grad.sizes() == c10::IntArrayRef({2}) && grad.storage().nbytes() == 2 * sizeof(float) &&
              torch::equal(grad, torch::full({2}, static_cast<float>(want))),
          "rank " + std::to_string(s.global_rank()) + " of " + std::to_string(n) + ": x.grad must be " +
              std::to_string(want) + " " + std::to_string(want) + ", got " + got.str());
  }
};

void expect_gather_grads(const std::string& accelerator, int world) {
  TempDir dir;
  std::vector<int64_t> devices;
  for (int i = 0; i < world; ++i) devices.push_back(i);
  // A strategy object: a 2-core machine has 2 cpu devices, and these ranks need no cores of their own.
  std::shared_ptr<Strategy> strategy;
  if (accelerator == "xla") {
    strategy = std::make_shared<XLAStrategy>(devices);
  } else {
    strategy = std::make_shared<DDPStrategy>(std::make_shared<CPUAccelerator>(), devices);
  }
  GatherGrads m;
  Trainer t(TrainerOptions().strategy(strategy).max_steps(1).default_root_dir(dir.path)
                .enable_progress_bar(false).enable_checkpointing(false).logger(false).num_sanity_val_steps(0));
  try {
    t.fit(m, loader(16, 4));
  } catch (const std::exception& e) {
    ADD_FAILURE() << accelerator << ", " << world << " workers: " << e.what();
  }
}

}  // namespace

TEST(Strategies, AllGatherSyncGradsGivesEachRankItsSummedSliceOnCpu) {
  expect_gather_grads("cpu", 2);
  expect_gather_grads("cpu", 3);
}

TEST(Strategies, AllGatherSyncGradsGivesEachRankItsSummedSliceOnXla) {
  expect_gather_grads("xla", 2);
  expect_gather_grads("xla", 3);
}

namespace {

// Broadcasts, from each src, a cpu tensor and a tensor on the xla device, at
// the top level and inside a dict, a list and a tuple. Every rank must get
// src's values (src's rank number), each tensor on the device it started on.
struct BroadcastDevices : TinyRegression {
  void on_fit_start() override {
    Strategy& s = trainer()->strategy();
    const c10::Device dev = s.root_device();
    check(dev.type() == c10::kLazy, "root device is lazy, got " + dev.str());
    const double r = static_cast<double>(s.global_rank());
    const std::string me = "rank " + std::to_string(s.global_rank());
    for (int64_t src : {0, 1}) {
      const auto cpu_t = torch::full({2}, r);
      const auto dev_t = torch::full({3}, r, torch::TensorOptions().device(dev));
      auto expect = [&](const c10::IValue& v, const c10::Device& want, int64_t numel, const std::string& where) {
        check(v.isTensor(), me + ": " + where + " is not a tensor");
        const at::Tensor t = v.toTensor();
        check(t.device() == want, me + ": " + where + " from src " + std::to_string(src) + " came back on " +
                                      t.device().str() + ", started on " + want.str());
        check(t.numel() == numel && t.to(torch::kCPU).eq(static_cast<double>(src)).all().item<bool>(),
              me + ": " + where + " holds src's values");
      };
      expect(s.broadcast(cpu_t, src), c10::Device(c10::kCPU), 2, "a top-level cpu tensor");
      expect(s.broadcast(dev_t, src), dev, 3, "a top-level xla tensor");
      auto d = make_dict();
      d.insert("cpu", cpu_t);
      d.insert("xla", dev_t);
      auto dict = c10::impl::toTypedDict<std::string, c10::IValue>(s.broadcast(d, src).toGenericDict());
      expect(dict.at("cpu"), c10::Device(c10::kCPU), 2, "dict['cpu']");
      expect(dict.at("xla"), dev, 3, "dict['xla']");
      c10::List<at::Tensor> list({cpu_t, dev_t});
      auto l = s.broadcast(list, src).toList();
      expect(l.get(0), c10::Device(c10::kCPU), 2, "list[0] (cpu)");
      expect(l.get(1), dev, 3, "list[1] (xla)");
      auto tuple = s.broadcast(c10::ivalue::Tuple::create({cpu_t, dev_t}), src).toTuple();
      expect(tuple->elements()[0], c10::Device(c10::kCPU), 2, "tuple[0] (cpu)");
      expect(tuple->elements()[1], dev, 3, "tuple[1] (xla)");
    }
  }
};

// One step on 2 xla workers; the checks run in the workers' hooks.
void fit_one_step_on_two_xla_workers(LightningModule& m, const std::string& dir) {
  Trainer t(opts(dir, "xla", "xla", 2).max_steps(1).enable_checkpointing(false).logger(false));
  try {
    t.fit(m, loader(16, 4));
  } catch (const std::exception& e) {
    ADD_FAILURE() << e.what();
  }
}

}  // namespace

TEST(Strategies, BroadcastKeepsEachTensorOnTheDeviceItStartedOn) {
  TempDir dir;
  BroadcastDevices m;
  fit_one_step_on_two_xla_workers(m, dir.path);
}

namespace {

// Every rank saves with storage_options, which the XLA CheckpointIO refuses,
// and records what it got in <dir>/rank-<r>.
struct SavesWithStorageOptions : TinyRegression {
  explicit SavesWithStorageOptions(std::string dir) : dir(std::move(dir)) {}
  void on_fit_start() override {
    Strategy& s = trainer()->strategy();
    std::string got = "returned normally";
    try {
      s.save_checkpoint(trainer()->dump_checkpoint(), dir + "/x.ckpt", {{"compress", "1"}});
    } catch (const std::invalid_argument& e) {
      got = std::string("invalid_argument: ") + e.what();
    } catch (const std::exception& e) {
      got = std::string("other exception: ") + e.what();
    }
    std::ofstream(dir + "/rank-" + std::to_string(s.global_rank())) << got;
    s.barrier("after the refused save");
  }
  std::string dir;
};

}  // namespace

TEST(Strategies, StorageOptionsAreRefusedOnEveryRankAndNothingIsWritten) {
  TempDir dir;
  SavesWithStorageOptions m(dir.path);
  Trainer t(opts(dir.path, "xla", "xla", 2).max_steps(1).enable_checkpointing(false).logger(false));
  t.fit(m, loader(16, 4));
  for (int r : {0, 1}) {
    const std::string got = fulgur::testing::read_file(dir.path + "/rank-" + std::to_string(r));
    EXPECT_EQ(got.rfind("invalid_argument: ", 0), 0u) << "rank " << r << ": " << got;
    EXPECT_NE(got.find("storage_options"), std::string::npos) << "rank " << r << ": " << got;
    EXPECT_NE(got.find("compress"), std::string::npos) << "rank " << r << ": " << got;
  }
  EXPECT_FALSE(std::filesystem::exists(dir.path + "/x.ckpt"));
}

namespace {

// reduce on an xla tensor, then a row of the result, detached (as logging
// and AccumulateGrad detach): rank r holds rows [r, r+1], so the sum over 2
// ranks is rows [1, 3].
struct ReduceRows : TinyRegression {
  void on_fit_start() override {
    Strategy& s = trainer()->strategy();
    const double r = static_cast<double>(s.global_rank());
    auto x = torch::stack({torch::full({2}, r), torch::full({2}, r + 1)}).to(s.root_device());
    const at::Tensor sum = s.reduce(x, "sum");
    check(sum.device() == s.root_device(), "reduce keeps the device");
    const at::Tensor row = sum[1].detach().to(torch::kCPU);
    std::ostringstream got;
    got << row.sizes();
    check(row.sizes() == c10::IntArrayRef({2}) && torch::equal(row, torch::full({2}, 3.0f)),
          "row 1 of the reduced sum must be [3, 3], got a tensor of shape " + got.str());
  }
};

}  // namespace

TEST(Strategies, ReduceOnXlaGivesATensorWhoseRowsReadRight) {
  TempDir dir;
  ReduceRows m;
  fit_one_step_on_two_xla_workers(m, dir.path);
}

namespace {

// Logs a test loss, so that a test run adds a column to metrics.csv.
struct WithTestStep : TinyRegression {
  StepOutput test_step(const Batch& b, int64_t) override {
    auto loss = torch::mse_loss(forward(b.data), b.target);
    log("test_loss", loss, LogOptions().sync_dist(true));
    return loss;
  }
};

std::vector<std::string> lines_of(const std::string& path) {
  std::istringstream in(fulgur::testing::read_file(path));
  std::vector<std::string> out;
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

std::vector<std::string> folders_in(const std::string& path) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(path)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

// As `mnist --devices 2 --strategy ddp` does: fit on 2 workers, then test.
// The test row joins the fit's rows in the same version folder; its new
// column widens the header.
TEST(Logging, TestAfterATwoWorkerFitAppendsToTheFitsMetricsCsv) {
  TempDir dir;
  WithTestStep m;
  Trainer t(opts(dir.path, "cpu", "ddp", 2).max_epochs(1).log_every_n_steps(2).enable_checkpointing(false));
  t.fit(m, loader(64, 4));  // 32 samples per rank, 8 steps: rows at steps 2, 4, 6, 8
  t.test(m, loader(32, 4));
  EXPECT_EQ(folders_in(dir.path + "/lightning_logs"), (std::vector<std::string>{"version_0"}));
  EXPECT_EQ(t.logger()->version(), "0");
  const auto lines = lines_of(dir.path + "/lightning_logs/version_0/metrics.csv");
  ASSERT_EQ(lines.size(), 6u) << ::testing::PrintToString(lines);
  EXPECT_EQ(lines[0], "epoch,test_loss,train_loss,step");
  for (int i = 1; i <= 4; ++i) {
    EXPECT_EQ(lines[i].substr(0, 3), "0,,") << lines[i];  // epoch 0, no test_loss
    EXPECT_EQ(lines[i].substr(lines[i].rfind(',') + 1), std::to_string(2 * i)) << lines[i];
  }
  EXPECT_NE(lines[5].find(",,8"), std::string::npos) << "test row: no train_loss, step 8: " << lines[5];
}

// Each epoch's score is fixed; EarlyStopping stops after epoch 3.
struct ScoredByEpoch : TinyRegression {
  explicit ScoredByEpoch(std::vector<double> s) : scores(std::move(s)) {}
  StepOutput validation_step(const Batch&, int64_t) override {
    log("score", scores.at(current_epoch()));
    return {};
  }
  std::vector<double> scores;
};

// Counts training batches; its state says which rank it came from.
struct BatchCounter : Callback {
  std::string state_key() const override { return "BatchCounter"; }
  void on_train_batch_end(Trainer& t, LightningModule&, const StepOutput&, const Batch&, int64_t) override {
    ++batches;
    rank = t.global_rank();
  }
  c10::IValue state_dict() const override {
    auto d = make_dict();
    d.insert("batches", batches);
    d.insert("rank", rank);
    return d;
  }
  void load_state_dict(const c10::IValue& s) override {
    auto d = c10::impl::toTypedDict<std::string, c10::IValue>(s.toGenericDict());
    batches = d.at("batches").toInt();
    rank = d.at("rank").toInt();
  }
  int64_t batches = 0;
  int64_t rank = -1;
};

// Issue 32, C11: every public accessor of a callback reads in the launching process what it reads
// on rank 0 (ModelCheckpoint::dirpath() and EarlyStopping::reason() used to stay empty).
TEST(Callbacks, EveryCallbacksStateComesBackFromRankZero) {
  TempDir dir;
  ScoredByEpoch m({1.0, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0});
  auto es = std::make_shared<EarlyStopping>(EarlyStoppingOptions("score").patience(2));
  auto counter = std::make_shared<BatchCounter>();
  auto mc = std::make_shared<ModelCheckpoint>(ModelCheckpointOptions().monitor("score"));
  Trainer t(opts(dir.path, "cpu", "ddp", 2).max_epochs(7).logger(false).callbacks({es, counter, mc}));
  t.fit(m, loader(32, 4), loader(16, 4));
  EXPECT_EQ(mc->dirpath(), dir.path + "/checkpoints");
  EXPECT_EQ(std::filesystem::path(mc->best_model_path()).parent_path().string(), mc->dirpath());
  EXPECT_NE(es->reason().find("score"), std::string::npos) << es->reason();
  // Best at epoch 1; epochs 2 and 3 do not improve: stop after epoch 3.
  EXPECT_EQ(t.current_epoch(), 4);
  EXPECT_EQ(es->stopped_epoch(), 3);
  EXPECT_EQ(es->wait_count(), 2);
  EXPECT_DOUBLE_EQ(es->best_score(), 0.5);
  EXPECT_EQ(counter->rank, 0);
  EXPECT_EQ(counter->batches, 4 * 4);  // 4 epochs of 16 samples per rank in batches of 4
}

namespace {

// Four batches of a fixed problem, from no Dataset: a strategy cannot give it a sampler.
struct FourBatches : BatchSource {
  struct Stream : BatchStream {
    explicit Stream(int64_t i) : i(i) {}
    std::optional<Batch> next() override {
      if (i >= 4) return std::nullopt;
      ++i;
      return Batch(torch::ones({4, 8}), torch::ones({4, 1}));
    }
    int64_t i;
  };
  int64_t num_batches() const override { return 4; }
  void set_epoch(int64_t) override {}
  std::unique_ptr<BatchStream> open(int64_t skip) override { return std::make_unique<Stream>(skip); }
};

}  // namespace

// Every rank would train on all of it; the strategy refuses, and says how to fix it.
TEST(Strategies, SourceThatIsNotADataLoaderIsRefusedOnSeveralRanks) {
  for (const std::string& accelerator : {"cpu", "xla"}) {
    TempDir dir;
    TinyRegression m;
    Trainer t(opts(dir.path, accelerator, accelerator == "cpu" ? "ddp" : "xla", 2).max_epochs(1).enable_checkpointing(false));
    try {
      t.fit(m, std::make_shared<FourBatches>());
      FAIL() << accelerator << ": a source that is not a DataLoader was used unsharded";
    } catch (const WorkerFailure& e) {
      EXPECT_NE(std::string(e.what()).find("not a DataLoader"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("use_distributed_sampler(false)"), std::string::npos) << e.what();
    }
  }
}

// A source that shards itself runs when the user says so; a DataLoader is then not sharded either.
TEST(Strategies, WithoutTheDistributedSamplerEveryLoaderIsUsedAsGiven) {
  TempDir dir;
  TinyRegression m;
  Trainer t(opts(dir.path, "cpu", "ddp", 2).max_epochs(1).use_distributed_sampler(false).enable_checkpointing(false));
  t.fit(m, std::make_shared<FourBatches>());
  EXPECT_EQ(t.global_step(), 4);
  TinyRegression m2;
  Trainer t2(opts(dir.path, "cpu", "ddp", 2).max_epochs(1).use_distributed_sampler(false).enable_checkpointing(false));
  t2.fit(m2, loader(64, 4));
  EXPECT_EQ(t2.global_step(), 16) << "each rank takes all 64 samples";
}

// The distributed sampler pads (its own drop_last off, as Lightning sets it);
// the loader's drop_last drops each rank's short last batch. 19 samples on 2
// ranks: 10 each, 2 batches of 5. A sampler that cut the tail (9 each) would
// leave 1.
TEST(Strategies, DistributedSamplerPadsAndDropLastActsOnEachRanksBatches) {
  TempDir dir;
  TinyRegression m;
  Trainer t(opts(dir.path, "cpu", "ddp", 2).max_epochs(1).enable_checkpointing(false));
  t.fit(m, std::make_shared<DataLoader>(regression_data(19), DataLoaderOptions(5).drop_last(true)));
  EXPECT_EQ(t.global_step(), 2);
}

namespace {

// Runs a 2-worker fit in a child process with FULGUR_LOG_LEVEL=`level` (unset
// when empty) and returns what the job wrote to stderr.
std::string stderr_of_two_worker_fit(const std::string& root, const std::string& level,
                                     std::vector<std::shared_ptr<Callback>> callbacks = {}) {
  const std::string path = root + "/stderr-" + (level.empty() ? "unset" : level) + ".txt";
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, STDERR_FILENO);
    if (level.empty()) ::unsetenv("FULGUR_LOG_LEVEL");
    else ::setenv("FULGUR_LOG_LEVEL", level.c_str(), 1);
    int code = 0;
    try {
      TinyRegression m;
      Trainer t(opts(root + "/run-" + level, "cpu", "ddp", 2).max_steps(4).enable_checkpointing(false)
                    .enable_model_summary(false).callbacks(callbacks));
      t.fit(m, loader(64, 4));
    } catch (...) {
      code = 1;
    }
    ::_exit(code);
  }
  int status = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status << ": " << fulgur::testing::read_file(path);
  return fulgur::testing::read_file(path);
}

int64_t count_of(const std::string& text, const std::string& what) {
  int64_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

}  // namespace

// Information is rank 0's (Lightning's rank_zero_info): one cluster-environment line for the job.
TEST(Logging, TwoWorkersPrintTheClusterEnvironmentOnce) {
  TempDir dir;
  const std::string err = stderr_of_two_worker_fit(dir.path, "");
  EXPECT_EQ(count_of(err, "cluster environment"), 1) << err;
  EXPECT_EQ(count_of(err, ":0"), 0) << "a port the single-node job does not use: " << err;
}

namespace {

// Every rank writes 50 long lines at each batch, all at once.
struct Chatty : Callback {
  std::string state_key() const override { return "Chatty"; }
  void on_train_batch_end(Trainer& t, LightningModule&, const StepOutput&, const Batch&, int64_t) override {
    const std::string line(300, static_cast<char>('a' + t.global_rank()));
    for (int i = 0; i < 50; ++i) runtime::log(runtime::LogLevel::kWarning, line);
  }
};

}  // namespace

// Two ranks' lines never share a line; FULGUR_LOG_LEVEL chooses what is written, "off" nothing.
TEST(Logging, LinesOfTwoRanksStayWholeAndTheLevelIsChosenByEnvironment) {
  TempDir dir;
  const std::string rank0 = "fulgur: rank 0: " + std::string(300, 'a');
  const std::string rank1 = "fulgur: rank 1: " + std::string(300, 'b');
  std::istringstream lines(stderr_of_two_worker_fit(dir.path, "", {std::make_shared<Chatty>()}));
  int64_t from0 = 0, from1 = 0, info = 0, end = 0;
  for (std::string line; std::getline(lines, line);) {
    if (line == rank0) {
      ++from0;
    } else if (line == rank1) {
      ++from1;
    } else if (line == "fulgur: fit stopped at epoch 0, step 4: max_steps=4 reached" ||
               line == "fulgur: no checkpoints (enable_checkpointing is off)" || line.rfind("fulgur: logs: ", 0) == 0) {
      ++end;  // rank 0's end-of-fit report
    } else {
      EXPECT_EQ(line.rfind("fulgur: cluster environment lightning: world size 2, global rank 0,", 0), 0u)
          << "not a whole line of one rank: " << line;
      ++info;
    }
  }
  EXPECT_EQ(from0, 4 * 50);
  EXPECT_EQ(from1, 4 * 50);
  EXPECT_EQ(info, 1);
  EXPECT_EQ(end, 3);
  const std::string quiet = stderr_of_two_worker_fit(dir.path, "warning", {std::make_shared<Chatty>()});
  EXPECT_EQ(count_of(quiet, "cluster environment"), 0);
  EXPECT_EQ(count_of(quiet, "\n"), 2 * 4 * 50);
  EXPECT_EQ(count_of(stderr_of_two_worker_fit(dir.path, "debug"), "cluster environment"), 2) << "every rank's, at debug";
  EXPECT_EQ(stderr_of_two_worker_fit(dir.path, "off", {std::make_shared<Chatty>()}), "");
}

namespace {

// predict_dataloader refuses to run before setup("predict").
struct PredictData : DataModule {
  explicit PredictData(std::shared_ptr<TensorDataset> data) : data(std::move(data)) {}
  void setup(const std::string& stage) override { stage_seen = stage; }
  std::shared_ptr<BatchSource> predict_dataloader() override {
    if (stage_seen != "predict") throw std::runtime_error("predict_dataloader before setup(\"predict\"): '" + stage_seen + "'");
    return std::make_shared<DataLoader>(data, DataLoaderOptions(3).shuffle(true).seed(4));
  }
  std::shared_ptr<TensorDataset> data;
  std::string stage_seen;
};

// Saves this rank's predictions and their dataset indices to
// <dir>/predictions_rank<R>.pt at the epoch end; counts the batch calls.
struct RankFileWriter : BasePredictionWriter {
  explicit RankFileWriter(std::string dir) : BasePredictionWriter("batch_and_epoch"), dir(std::move(dir)) {}
  void write_on_batch_end(Trainer&, LightningModule&, const at::Tensor& prediction, const std::vector<int64_t>& indices,
                          const Batch&, int64_t) override {
    check(prediction.size(0) == static_cast<int64_t>(indices.size()), "one index per predicted sample");
    ++batches;
  }
  void write_on_epoch_end(Trainer& t, LightningModule&, const std::vector<at::Tensor>& predictions,
                          const std::vector<std::vector<int64_t>>& batch_indices) override {
    std::vector<int64_t> flat;
    for (const auto& b : batch_indices) flat.insert(flat.end(), b.begin(), b.end());
    check(batches == static_cast<int64_t>(predictions.size()), "write_on_batch_end ran once per batch");
    std::vector<torch::Tensor> out{torch::cat(predictions), torch::tensor(flat, torch::kInt64)};
    torch::save(out, dir + "/predictions_rank" + std::to_string(t.global_rank()) + ".pt");
  }
  std::string dir;
  int64_t batches = 0;
};

}  // namespace

// 11 samples on 2 ddp workers: 6 each (the sampler repeats one), in batches of
// 3. Each worker writes its own file; together they cover the data set, and
// every prediction is the model's output for its index.
TEST(Predict, DataModuleAndAWriterOnEveryRankCoverTheDataSetOnTwoWorkers) {
  TempDir dir;
  struct P : TinyRegression {
    torch::Tensor predict_step(const Batch& b, int64_t) override { return forward(b.data); }
  } m;
  auto data = regression_data(11);
  PredictData dm(data);
  Trainer t(opts(dir.path, "cpu", "ddp", 2).callbacks({std::make_shared<RankFileWriter>(dir.path)}));
  const auto returned = t.predict(m, dm);
  EXPECT_EQ(returned.size(), 2u) << "rank 0's two batches come back";
  std::set<int64_t> covered;
  torch::NoGradGuard no_grad;
  for (int rank = 0; rank < 2; ++rank) {
    std::vector<torch::Tensor> saved;
    torch::load(saved, dir.path + "/predictions_rank" + std::to_string(rank) + ".pt");
    ASSERT_EQ(saved.size(), 2u);
    const auto& preds = saved[0];
    const auto& idx = saved[1];
    ASSERT_EQ(idx.numel(), 6) << "rank " << rank;
    ASSERT_EQ(preds.size(0), 6) << "rank " << rank;
    for (int64_t i = 0; i < idx.numel(); ++i) {
      const int64_t k = idx[i].item<int64_t>();
      covered.insert(k);
      EXPECT_TRUE(torch::allclose(preds[i], m.forward(data->data()[k].unsqueeze(0))[0]))
          << "rank " << rank << " sample " << k;
    }
  }
  EXPECT_EQ(covered.size(), 11u);
  EXPECT_EQ(*covered.begin(), 0);
  EXPECT_EQ(*covered.rbegin(), 10);
}

TEST(Predict, WriterRefusesAnUnknownInterval) {
  try {
    BasePredictionWriter w("step");
    FAIL() << "write_interval 'step' was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("'step'"), std::string::npos) << e.what();
  }
}

// What the GUIDE says about a strategy used without a Trainer: before launch
// it is one process (rank queries 0 / 1, collectives return their input);
// launcher()->launch(fn) starts the workers, and setup_environment() in each
// joins the process group, after which the collectives span the ranks.
TEST(Strategies, AStrategyWithoutATrainerRunsCollectivesOnceLaunched) {
  DDPStrategy s(std::make_shared<CPUAccelerator>(), {0, 1}, nullptr, nullptr,
                ParallelOptions().timeout(std::chrono::milliseconds(20000)));
  EXPECT_EQ(s.world_size(), 1);
  EXPECT_EQ(s.global_rank(), 0);
  EXPECT_TRUE(torch::equal(s.reduce(torch::full({2}, 3.0), "sum"), torch::full({2}, 3.0)));
  EXPECT_EQ(s.all_gather(torch::ones({2})).sizes(), (std::vector<int64_t>{2})) << "the input, unchanged";
  EXPECT_EQ(s.broadcast(c10::IValue(int64_t{7})).toInt(), 7);
  s.barrier("before launch");
  EXPECT_EQ(s.collectives(), nullptr);
  const c10::IValue result = s.launcher()->launch([&]() -> c10::IValue {
    s.setup_environment();
    struct Teardown {
      ParallelStrategy& s;
      ~Teardown() { s.teardown(); }
    } teardown{s};
    const double r = static_cast<double>(s.global_rank());
    auto out = make_dict();
    out.insert("world_size", s.world_size());
    out.insert("sum", s.reduce(torch::full({1}, r + 1), "sum").item<double>());
    out.insert("gathered", s.all_gather(torch::full({1}, r)));
    out.insert("from_rank_1", s.broadcast(c10::IValue(s.global_rank() * 10), 1));
    s.barrier("after");
    return out;
  });
  auto d = c10::impl::toTypedDict<std::string, c10::IValue>(result.toGenericDict());
  EXPECT_EQ(d.at("world_size").toInt(), 2);
  EXPECT_DOUBLE_EQ(d.at("sum").toDouble(), 1.0 + 2.0);
  EXPECT_TRUE(torch::equal(d.at("gathered").toTensor(), torch::tensor({{0.0f}, {1.0f}})));
  EXPECT_EQ(d.at("from_rank_1").toInt(), 10);
}

namespace {

// Manual optimization with two backwards (each on half the batch, half the loss) before one step.
struct TwoBackwardsPerStep : TinyRegression {
  TwoBackwardsPerStep() { set_automatic_optimization(false); }
  StepOutput training_step(const Batch& b, int64_t) override {
    auto opt = optimizers().at(0);
    opt.zero_grad();
    const int64_t half = b.data.size(0) / 2;
    for (int64_t part = 0; part < 2; ++part) {
      const auto x = b.data.narrow(0, part * half, half), y = b.target.narrow(0, part * half, half);
      manual_backward(torch::mse_loss(forward(x), y) / 2);
    }
    opt.step();
    return {};
  }
};

}  // namespace

// Issue 32, A2: the bucket reducer took a parameter's first gradient and ignored the second
// backward's, so DDP with two manual_backward calls per step trained on half of each batch.
// Two ranks must end where one process with the whole batch does.
TEST(Strategies, DdpManualOptimizationSyncsEveryBackwardsGradient) {
  TempDir dir;
  torch::manual_seed(0);
  TwoBackwardsPerStep two;
  torch::manual_seed(0);
  TinyRegression one;
  Trainer t2(opts(dir.path, "cpu", "ddp", 2).max_epochs(2).enable_checkpointing(false));
  t2.fit(two, loader(64, 4));
  Trainer t1(opts(dir.path, "cpu", "single_device", 1).max_epochs(2).enable_checkpointing(false));
  t1.fit(one, loader(64, 8));
  EXPECT_EQ(t2.global_step(), 16);
  EXPECT_TRUE(torch::allclose(flat_params(two), flat_params(one), 1e-5, 1e-6))
      << flat_params(two) << "\n" << flat_params(one);
}
