// SPDX-License-Identifier: Apache-2.0
#pragma once
// Test helpers: temporary folders, real multi-process runs, small models.

#include <fulgur/distributed/collectives.h>
#include <fulgur/fulgur.h>

#include <torch/torch.h>

#include <functional>
#include <string>
#include <vector>

namespace fulgur::testing {

// A fresh empty folder, removed when the object goes away.
struct TempDir {
  TempDir();
  ~TempDir();
  std::string path;
};

// The MNIST folder (from FULGUR_DATA_DIR, set by CTest).
std::string mnist_dir();

// The whole content of a file ("" when it cannot be read).
std::string read_file(const std::string& path);

// A program built beside this test binary (build/bin/<name>).
std::string program(const std::string& name);

struct RankResult {
  int status = 0;           // waitpid status
  std::string error;        // what the rank threw (empty if it returned)
  bool exited_ok() const;
};

// Forks `world` processes; each joins a process group (file store in a
// private folder, Gloo on loopback) and runs fn(collectives). A rank that
// throws reports its message. Kills every rank still running after
// `timeout_s` seconds.
std::vector<RankResult> run_ranks(int world, const std::function<void(Collectives&)>& fn, int timeout_s = 60,
                                  std::chrono::milliseconds collective_timeout = std::chrono::milliseconds(20000));

// How FaultyCheckpointIO's failing save fails.
enum class WriteFault {
  // It throws std::runtime_error before anything is written, as an IO that
  // refuses the path would.
  kRefused,
  // The inner IO's own write fails part way through the file, as on a full
  // disk: the process's file size limit (RLIMIT_FSIZE, with SIGXFSZ ignored)
  // is `FaultyCheckpointIO::kBytesBeforeFull` bytes during that save, so write(2)
  // returns EFBIG once the file reaches it.
  kDiskFull,
};

// A CheckpointIO that passes every call to `inner`, except that its
// `fail_at`-th save (1-based, counted in this process) fails as `fault`
// says; the saves after it pass again. As leveldb's test Env, which fails
// the k-th write of a database.
class FaultyCheckpointIO : public CheckpointIO {
 public:
  static constexpr int64_t kBytesBeforeFull = 512;
  FaultyCheckpointIO(std::shared_ptr<CheckpointIO> inner, int fail_at, WriteFault fault);
  void save_checkpoint(const Checkpoint& checkpoint, const std::string& path,
                       const StorageOptions& storage_options = {}) override;
  Checkpoint load_checkpoint(const std::string& path) override { return inner_->load_checkpoint(path); }
  void remove_checkpoint(const std::string& path) override { inner_->remove_checkpoint(path); }
  // Saves asked for so far in this process, the failed one included.
  int saves() const { return saves_; }

 private:
  std::shared_ptr<CheckpointIO> inner_;
  int fail_at_;
  WriteFault fault_;
  int saves_ = 0;
};

// A linear regression module on random data: deterministic and fast.
struct TinyRegression : LightningModule {
  explicit TinyRegression(double lr = 0.1, int64_t in = 8);
  torch::Tensor forward(const torch::Tensor& x) { return fc->forward(x); }
  StepOutput training_step(const Batch& b, int64_t) override;
  StepOutput validation_step(const Batch& b, int64_t) override;
  OptimizerConfig configure_optimizers() override;
  double lr;
  torch::nn::Linear fc{nullptr};
  std::vector<double> losses;  // every training loss, in order
};

// One CPU process writing only what a test reads: no progress bar, no model summary, no sanity
// validation, logs under `root`.
TrainerOptions quiet_cpu_options(const std::string& root);

// n samples of a fixed random linear problem.
std::shared_ptr<TensorDataset> regression_data(int64_t n, int64_t in = 8, uint64_t seed = 0);

// A loader of regression_data(n) in batches of `batch`.
std::shared_ptr<DataLoader> regression_loader(int64_t n, int64_t batch);

// A module's parameters by name, copied to the CPU (a later step leaves the copies alone).
using Weights = std::vector<std::pair<std::string, at::Tensor>>;
Weights weights_of(torch::nn::Module& module);

// Live children of this process whose command line contains `needle`.
std::vector<int> processes_matching(const std::string& needle);

}  // namespace fulgur::testing
