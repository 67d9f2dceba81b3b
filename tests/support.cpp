// SPDX-License-Identifier: Apache-2.0
#include "support.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

namespace fs = std::filesystem;

namespace fulgur::testing {

TempDir::TempDir() {
  std::string tpl = (fs::temp_directory_path() / "fulgur-test-XXXXXX").string();
  std::vector<char> buf(tpl.begin(), tpl.end());
  buf.push_back('\0');
  path = ::mkdtemp(buf.data());
}

TempDir::~TempDir() {
  std::error_code ec;
  fs::remove_all(path, ec);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string program(const std::string& name) { return (fs::read_symlink("/proc/self/exe").parent_path() / name).string(); }

std::string mnist_dir() {
  const char* d = std::getenv("FULGUR_DATA_DIR");
  return std::string(d ? d : "data") + "/mnist";
}

bool RankResult::exited_ok() const { return WIFEXITED(status) && WEXITSTATUS(status) == 0; }

std::vector<RankResult> run_ranks(int world, const std::function<void(Collectives&)>& fn, int timeout_s,
                                  std::chrono::milliseconds collective_timeout) {
  TempDir dir;
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      at::set_num_threads(1);
      std::string error;
      try {
        auto o = RendezvousOptions()
            .rank(r)
            .world_size(world)
            .store_path(dir.path + "/store")
            .timeout(collective_timeout);
        auto c = Collectives::create(o);
        fn(*c);
        c->shutdown();
      } catch (const std::exception& e) {
        error = e.what();
      }
      std::ofstream(dir.path + "/error-" + std::to_string(r)) << error;
      std::fflush(nullptr);
      ::_exit(error.empty() ? 0 : 1);
    }
    pids.push_back(pid);
  }
  std::vector<RankResult> out(world);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  std::vector<bool> done(world, false);
  int left = world;
  while (left > 0) {
    for (int r = 0; r < world; ++r) {
      if (done[r]) continue;
      if (::waitpid(pids[r], &out[r].status, WNOHANG) == pids[r]) {
        done[r] = true;
        --left;
      }
    }
    if (std::chrono::steady_clock::now() > deadline) {
      for (int r = 0; r < world; ++r)
        if (!done[r]) ::kill(pids[r], SIGKILL);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (int r = 0; r < world; ++r) {
    std::ifstream in(dir.path + "/error-" + std::to_string(r));
    std::stringstream ss;
    ss << in.rdbuf();
    out[r].error = ss.str();
  }
  return out;
}

FaultyCheckpointIO::FaultyCheckpointIO(std::shared_ptr<CheckpointIO> inner, int fail_at, WriteFault fault)
    : inner_(std::move(inner)), fail_at_(fail_at), fault_(fault) {
  if (!inner_) throw std::invalid_argument("FaultyCheckpointIO: inner is null; pass the CheckpointIO to wrap");
  if (fail_at_ < 1) throw std::invalid_argument("FaultyCheckpointIO: fail_at=" + std::to_string(fail_at_) + " must be >= 1");
}

void FaultyCheckpointIO::save_checkpoint(const Checkpoint& checkpoint, const std::string& path,
                                         const StorageOptions& storage_options) {
  if (++saves_ != fail_at_) return inner_->save_checkpoint(checkpoint, path, storage_options);
  if (fault_ == WriteFault::kRefused) {
    throw std::runtime_error("FaultyCheckpointIO: save " + std::to_string(saves_) + " (" + path + ") refused by the test");
  }
  // The limit and the signal's action are the process's: restored on every path out.
  struct rlimit old_limit {};
  if (::getrlimit(RLIMIT_FSIZE, &old_limit) != 0) throw std::runtime_error("FaultyCheckpointIO: getrlimit failed");
  struct sigaction ignore {}, old_action {};
  ignore.sa_handler = SIG_IGN;
  ::sigaction(SIGXFSZ, &ignore, &old_action);
  struct Restore {
    struct rlimit limit;
    struct sigaction action;
    ~Restore() {
      ::setrlimit(RLIMIT_FSIZE, &limit);
      ::sigaction(SIGXFSZ, &action, nullptr);
    }
  } restore{old_limit, old_action};
  struct rlimit full = old_limit;
  full.rlim_cur = static_cast<rlim_t>(kBytesBeforeFull);
  if (::setrlimit(RLIMIT_FSIZE, &full) != 0) throw std::runtime_error("FaultyCheckpointIO: setrlimit failed");
  inner_->save_checkpoint(checkpoint, path, storage_options);
}

TinyRegression::TinyRegression(double lr_in, int64_t in) : LightningModule("TinyRegression"), lr(lr_in) {
  fc = register_module("fc", torch::nn::Linear(in, 1));
}

StepOutput TinyRegression::training_step(const Batch& b, int64_t) {
  auto loss = torch::mse_loss(forward(b.data), b.target);
  losses.push_back(loss.item<double>());
  log("train_loss", loss, LogOptions().prog_bar(true));
  return loss;
}

StepOutput TinyRegression::validation_step(const Batch& b, int64_t) {
  auto loss = torch::mse_loss(forward(b.data), b.target);
  log("val_loss", loss, LogOptions().sync_dist(true));
  return loss;
}

OptimizerConfig TinyRegression::configure_optimizers() {
  return std::make_shared<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(lr));
}

TrainerOptions quiet_cpu_options(const std::string& root) {
  return TrainerOptions()
      .accelerator("cpu")
      .devices(1)
      .default_root_dir(root)
      .enable_progress_bar(false)
      .enable_model_summary(false)
      .num_sanity_val_steps(0);
}

std::shared_ptr<TensorDataset> regression_data(int64_t n, int64_t in, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  auto x = at::randn({n, in}, gen);
  auto w = at::randn({in, 1}, gen);
  auto y = x.matmul(w) + 0.1 * at::randn({n, 1}, gen);
  return std::make_shared<TensorDataset>(x, y);
}

std::shared_ptr<DataLoader> regression_loader(int64_t n, int64_t batch) {
  return std::make_shared<DataLoader>(regression_data(n), DataLoaderOptions(batch));
}

Weights weights_of(torch::nn::Module& module) {
  Weights out;
  for (const auto& p : module.named_parameters(true)) out.emplace_back(p.key(), p.value().detach().to(torch::kCPU).clone());
  return out;
}

std::vector<int> processes_matching(const std::string& needle) {
  std::vector<int> out;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const int pid = std::stoi(name);
    if (pid == ::getpid()) continue;
    std::ifstream in(e.path() / "cmdline", std::ios::binary);
    std::string cmd((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    for (auto& c : cmd)
      if (c == '\0') c = ' ';
    std::ifstream st(e.path() / "stat");
    std::string stat;
    std::getline(st, stat);
    const auto close = stat.rfind(')');
    const bool zombie = close != std::string::npos && close + 2 < stat.size() && stat[close + 2] == 'Z';
    // Only this process's children: CTest may run other instances of the same binary.
    int ppid = -1;
    if (close != std::string::npos) std::sscanf(stat.c_str() + close + 2, "%*c %d", &ppid);
    if (!zombie && ppid == ::getpid() && cmd.find(needle) != std::string::npos) out.push_back(pid);
  }
  return out;
}

}  // namespace fulgur::testing
