// SPDX-License-Identifier: Apache-2.0
// Jobs across machines: cluster environment detection, Gloo's interface, and
// a real 2-node x 2-worker MNIST job between two network namespaces joined
// by a veth pair (needs root, as CI runs).

#include "support.h"

#include "distributed/network.h"

#include <fulgur/plugins/environments/cluster_environment.h>

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <thread>

using namespace fulgur;
using fulgur::testing::read_file;
using fulgur::testing::TempDir;

namespace {

// Sets variables for the scope of a test and restores the old values.
struct EnvGuard {
  explicit EnvGuard(const std::map<std::string, std::optional<std::string>>& vars) {
    for (const auto& [k, v] : vars) {
      const char* old = std::getenv(k.c_str());
      saved[k] = old ? std::optional<std::string>(old) : std::nullopt;
      if (v) setenv(k.c_str(), v->c_str(), 1);
      else unsetenv(k.c_str());
    }
  }
  ~EnvGuard() {
    for (const auto& [k, v] : saved) {
      if (v) setenv(k.c_str(), v->c_str(), 1);
      else unsetenv(k.c_str());
    }
  }
  std::map<std::string, std::optional<std::string>> saved;
};

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// The example's final report: its line that starts with "mnist: ".
std::string report_line(const std::string& log) {
  const auto at = log.rfind("mnist: ");
  return at == std::string::npos ? "" : log.substr(at, log.find('\n', at) - at);
}

}  // namespace

// --- Cluster environments ----------------------------------------------------

TEST(ClusterEnvironment, SlurmFirstHostOfTheNodeList) {
  EXPECT_EQ(SLURMEnvironment::first_host("node07"), "node07");
  EXPECT_EQ(SLURMEnvironment::first_host("gpu[03-05,9],cpu1"), "gpu03");
  EXPECT_EQ(SLURMEnvironment::first_host("gpu[9,03-05]"), "gpu9");
  EXPECT_EQ(SLURMEnvironment::first_host("rack[2-3]-n[10-11]"), "rack2-n10");
  EXPECT_EQ(SLURMEnvironment::first_host("a1,b2"), "a1");
  EXPECT_THROW(SLURMEnvironment::first_host("gpu[03-05"), std::invalid_argument);
}

TEST(ClusterEnvironment, SlurmTaskIsDetectedWithItsRanksAndMainAddress) {
  EnvGuard g({{"SLURM_NTASKS", "4"},
              {"SLURM_PROCID", "3"},
              {"SLURM_LOCALID", "1"},
              {"SLURM_NODEID", "1"},
              {"SLURM_NODELIST", "cn[12-13]"},
              {"SLURM_JOB_ID", "1234567"},
              {"SLURM_JOB_NAME", "train"},
              {"MASTER_ADDR", std::nullopt},
              {"MASTER_PORT", std::nullopt},
              {"FULGUR_WORKER", std::nullopt}});
  auto env = detect_cluster_environment();
  EXPECT_EQ(env->name(), "slurm");
  EXPECT_TRUE(env->creates_processes_externally());
  EXPECT_EQ(describe(*env), "cluster environment slurm: world size 4, global rank 3, local rank 1, node rank 1, "
                            "main address cn12:19567");
  setenv("MASTER_PORT", "29400", 1);
  EXPECT_EQ(env->main_port(), 29400);
}

TEST(ClusterEnvironment, InteractiveSlurmAllocationAndFulgurWorkersAreNotSlurmTasks) {
  EnvGuard g({{"SLURM_NTASKS", "2"}, {"SLURM_JOB_NAME", "bash"}, {"FULGUR_WORKER", std::nullopt},
              {"RANK", std::nullopt}, {"LOCAL_RANK", std::nullopt}, {"GROUP_RANK", std::nullopt}});
  EXPECT_EQ(detect_cluster_environment()->name(), "lightning");
  setenv("SLURM_JOB_NAME", "train", 1);
  EXPECT_EQ(detect_cluster_environment()->name(), "slurm");
  setenv("FULGUR_WORKER", "1", 1);
  EXPECT_EQ(detect_cluster_environment()->name(), "lightning");
}

TEST(ClusterEnvironment, TorchrunWorkerUsesGroupRankAsNodeRank) {
  EnvGuard g({{"RANK", "5"}, {"GROUP_RANK", "2"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"},
              {"WORLD_SIZE", "6"}, {"MASTER_ADDR", "10.1.2.3"}, {"MASTER_PORT", "29500"},
              {"NODE_RANK", std::nullopt}, {"SLURM_NTASKS", std::nullopt}, {"FULGUR_WORKER", std::nullopt}});
  auto env = detect_cluster_environment();
  EXPECT_EQ(env->name(), "torchelastic");
  EXPECT_TRUE(env->creates_processes_externally());
  EXPECT_EQ(describe(*env), "cluster environment torchelastic: world size 6, global rank 5, local rank 1, node rank 2, "
                            "main address 10.1.2.3:29500");
}

// What each environment tells the strategy about the rendezvous: a fulgur
// worker's file store, node 0's store across nodes (one prefix per launch),
// torchrun's agent store (one prefix per restart), else a TCP store at the
// main address that rank 0 serves.
TEST(ClusterEnvironment, RendezvousComesFromTheEnvironmentOfTheLauncher) {
  EnvGuard g({{"FULGUR_STORE", "/tmp/launch-0/store"}, {"FULGUR_PARENT_STORE", std::nullopt},
              {"FULGUR_LAUNCH_INDEX", std::nullopt}, {"TORCHELASTIC_USE_AGENT_STORE", std::nullopt},
              {"TORCHELASTIC_RESTART_COUNT", std::nullopt}, {"MASTER_ADDR", "10.1.2.3"}, {"MASTER_PORT", "29500"},
              {"FULGUR_BIND_ADDRESS", "10.1.2.9"}, {"GLOO_SOCKET_IFNAME", std::nullopt},
              {"LOCAL_WORLD_SIZE", "3"}});
  const LightningEnvironment env;
  EXPECT_EQ(env.local_world_size(), 3);
  RendezvousPoint p = env.rendezvous();
  EXPECT_EQ(p.store_path, "/tmp/launch-0/store");
  EXPECT_EQ(p.bind_address, "") << "a file store binds Gloo to loopback";

  unsetenv("FULGUR_STORE");
  setenv("FULGUR_PARENT_STORE", "1", 1);
  setenv("FULGUR_LAUNCH_INDEX", "3", 1);
  p = env.rendezvous();
  EXPECT_EQ(p.store_path, "");
  EXPECT_EQ(p.host, "10.1.2.3");
  EXPECT_EQ(p.port, 29500);
  EXPECT_TRUE(p.store_served_externally);
  EXPECT_EQ(p.store_prefix, "launch-3");
  EXPECT_EQ(p.bind_address, "10.1.2.9");
  unsetenv("FULGUR_LAUNCH_INDEX");
  try {
    env.rendezvous();
    FAIL() << "a worker across nodes without FULGUR_LAUNCH_INDEX was given a rendezvous";
  } catch (const std::runtime_error& e) {
    EXPECT_TRUE(contains(e.what(), "FULGUR_LAUNCH_INDEX, which is not set")) << e.what();
  }

  unsetenv("FULGUR_PARENT_STORE");
  setenv("TORCHELASTIC_USE_AGENT_STORE", "True", 1);
  setenv("TORCHELASTIC_RESTART_COUNT", "2", 1);
  p = TorchElasticEnvironment().rendezvous();
  EXPECT_TRUE(p.store_served_externally);
  EXPECT_EQ(p.store_prefix, "/worker/attempt_2");

  unsetenv("TORCHELASTIC_USE_AGENT_STORE");
  p = env.rendezvous();
  EXPECT_FALSE(p.store_served_externally);
  EXPECT_EQ(p.store_prefix, "");
  EXPECT_EQ(p.host, "10.1.2.3");
  unsetenv("LOCAL_WORLD_SIZE");
  EXPECT_EQ(env.local_world_size(), 0);
}

namespace {

// A one-process job of the test's own, which counts what it is asked.
struct CountingEnvironment : ClusterEnvironment {
  explicit CountingEnvironment(std::string store) : store(std::move(store)) {}
  std::string name() const override { return "counting"; }
  bool creates_processes_externally() const override { return true; }
  std::string main_address() const override { return "127.0.0.1"; }
  int main_port() const override { return 0; }
  int64_t world_size() const override { return 1; }
  int64_t global_rank() const override {
    ++rank_questions;
    return 0;
  }
  int64_t local_rank() const override { return 0; }
  int64_t node_rank() const override { return 0; }
  RendezvousPoint rendezvous() const override {
    ++rendezvous_questions;
    RendezvousPoint p;
    p.store_path = store;
    return p;
  }
  std::string store;
  mutable int rank_questions = 0, rendezvous_questions = 0;
};

}  // namespace

// The environment given in ParallelOptions is the one the strategy holds and
// asks; nothing is detected (detection would find a SLURM job of 4 tasks
// here, which one device refuses).
TEST(ClusterEnvironment, TheEnvironmentGivenToTheStrategyIsHeldAndAsked) {
  EnvGuard g({{"SLURM_NTASKS", "4"}, {"SLURM_JOB_NAME", "train"}, {"SLURM_NODELIST", "cn1"},
              {"FULGUR_WORKER", std::nullopt}, {"RANK", std::nullopt}, {"LOCAL_RANK", std::nullopt}});
  EXPECT_THROW(DDPStrategy(std::make_shared<CPUAccelerator>(), {0}), std::invalid_argument);
  TempDir dir;
  auto env = std::make_shared<CountingEnvironment>(dir.path + "/store");
  auto po = ParallelOptions().cluster_environment(env).timeout(std::chrono::milliseconds(20000));
  auto strategy = std::make_shared<DDPStrategy>(std::make_shared<CPUAccelerator>(), std::vector<int64_t>{0}, nullptr,
                                                nullptr, po);
  EXPECT_EQ(&strategy->cluster_environment(), env.get());
  fulgur::testing::TinyRegression m;
  Trainer t(TrainerOptions().strategy(strategy).max_epochs(1).default_root_dir(dir.path)
                .enable_progress_bar(false).enable_model_summary(false).logger(false).enable_checkpointing(false));
  t.fit(m, std::make_shared<DataLoader>(fulgur::testing::regression_data(16), DataLoaderOptions(4)));
  EXPECT_EQ(t.global_step(), 4);
  EXPECT_EQ(env->rendezvous_questions, 1);
  EXPECT_GE(env->rank_questions, 1);
}

TEST(ClusterEnvironment, SlurmTaskCountMustMatchNodesTimesDevices) {
  EnvGuard g({{"SLURM_NTASKS", "2"}, {"SLURM_JOB_NAME", "train"}, {"SLURM_NODELIST", "cn1"},
              {"FULGUR_WORKER", std::nullopt}});
  try {
    Trainer t(TrainerOptions().accelerator("cpu").strategy("ddp").devices(2).num_nodes(2));
    FAIL() << "a SLURM job with 2 tasks was accepted for 2 nodes x 2 devices";
  } catch (const std::invalid_argument& e) {
    EXPECT_TRUE(contains(e.what(), "SLURM_NTASKS=2")) << e.what();
    EXPECT_TRUE(contains(e.what(), "--ntasks-per-node=2")) << e.what();
  }
}

TEST(ClusterEnvironment, SeveralNodesNeedMainAddressPortAndNodeRank) {
  EnvGuard g({{"MASTER_ADDR", "10.9.9.9"}, {"MASTER_PORT", "29500"}, {"NODE_RANK", std::nullopt}, {"NUM_NODES", std::nullopt},
              {"SLURM_NTASKS", std::nullopt}, {"RANK", std::nullopt}, {"LOCAL_RANK", std::nullopt}});
  try {
    Trainer t(TrainerOptions().accelerator("cpu").strategy("ddp").devices(2).num_nodes(2));
    FAIL() << "num_nodes=2 without NODE_RANK was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_TRUE(contains(e.what(), "NODE_RANK")) << e.what();
  }
  setenv("NODE_RANK", "2", 1);
  EXPECT_THROW(Trainer(TrainerOptions().accelerator("cpu").strategy("ddp").devices(2).num_nodes(2)), std::invalid_argument);
  setenv("NODE_RANK", "1", 1);
  setenv("NUM_NODES", "3", 1);
  try {
    Trainer t(TrainerOptions().accelerator("cpu").strategy("ddp").devices(2).num_nodes(2));
    FAIL() << "num_nodes=2 with NUM_NODES=3 was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_TRUE(contains(e.what(), "num_nodes=2 but the environment has NUM_NODES=3")) << e.what();
  }
}

TEST(ClusterEnvironment, NodeZeroNamesAMainPortInUse) {
  // Hold a port, then ask node 0's launcher to serve the store on it.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  const std::string port = std::to_string(ntohs(addr.sin_port));
  EnvGuard g({{"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", port}, {"NODE_RANK", "0"}, {"NUM_NODES", std::nullopt},
              {"SLURM_NTASKS", std::nullopt}, {"RANK", std::nullopt}, {"LOCAL_RANK", std::nullopt}});
  TempDir dir;
  fulgur::testing::TinyRegression m;
  Trainer t(TrainerOptions().accelerator("cpu").strategy("ddp").devices(1).num_nodes(2).default_root_dir(dir.path)
                .enable_progress_bar(false));
  try {
    t.fit(m, std::make_shared<DataLoader>(fulgur::testing::regression_data(16), DataLoaderOptions(4)));
    FAIL() << "node 0 served the store on a port in use";
  } catch (const CollectiveError& e) {
    EXPECT_TRUE(contains(e.what(), "MASTER_PORT=" + port)) << e.what();
  }
  ::close(fd);
  EXPECT_TRUE(fulgur::testing::processes_matching("test_multinode").empty()) << "a worker was started";
}

// --- Gloo's interface --------------------------------------------------------

TEST(GlooInterface, LoopbackMainAddressStaysOnLoopback) {
  EXPECT_TRUE(fulgur::detail::is_loopback_host("127.0.0.1"));
  EXPECT_TRUE(fulgur::detail::is_loopback_host("127.8.0.1"));
  EXPECT_TRUE(fulgur::detail::is_loopback_host("localhost"));
  EXPECT_FALSE(fulgur::detail::is_loopback_host("10.0.0.1"));
  EXPECT_EQ(fulgur::detail::interface_toward("127.0.0.1").name, "lo");
}

TEST(GlooInterface, UnknownInterfaceNameListsTheInterfaces) {
  auto o = RendezvousOptions()
      .host("127.0.0.1")
      .port(0)  // the store takes a free port
      .socket_ifname("nosuch0")
      .timeout(std::chrono::seconds(5));
  try {
    Collectives::create(o);
    FAIL() << "GLOO_SOCKET_IFNAME=nosuch0 was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_TRUE(contains(e.what(), "GLOO_SOCKET_IFNAME='nosuch0'")) << e.what();
    EXPECT_TRUE(contains(e.what(), "interfaces: ")) << e.what();
    EXPECT_TRUE(contains(e.what(), "lo")) << e.what();
  }
}

TEST(GlooInterface, UnresolvableMainAddressIsNamed) {
  try {
    fulgur::detail::interface_toward("no-such-host.invalid");
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_TRUE(contains(e.what(), "MASTER_ADDR='no-such-host.invalid'")) << e.what();
  }
}

// --- Two machines: network namespaces ------------------------------------------

namespace {

int sh(const std::string& cmd) {
  const int rc = std::system((cmd + " >/dev/null 2>&1").c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

// Two network namespaces, "node 0" at 10.77.0.1 and "node 1" at 10.77.0.2,
// joined by a veth pair; names carry this process's pid. Removed (with any
// process still inside) when the object goes away.
struct TwoHosts {
  TwoHosts() {
    const std::string id = std::to_string(::getpid());
    ns = {"fulgur-" + id + "-0", "fulgur-" + id + "-1"};
    veth = {"fgv" + id + "a", "fgv" + id + "b"};
    if (::geteuid() != 0) {
      skip_reason = "needs root to create network namespaces (ip netns add); CI runs the suite as root";
      return;
    }
    if (sh("ip netns add " + ns[0]) != 0) {
      skip_reason = "cannot create a network namespace here ('ip netns add' failed: no iproute2, or no CAP_SYS_ADMIN)";
      return;
    }
    made = true;
    ok = sh("ip netns add " + ns[1]) == 0 && sh("ip link add " + veth[0] + " type veth peer name " + veth[1]) == 0;
    for (int i = 0; ok && i < 2; ++i) {
      const std::string in = "ip -n " + ns[i] + " ";
      ok = sh("ip link set " + veth[i] + " netns " + ns[i]) == 0 &&
           sh(in + "addr add " + address(i) + "/24 dev " + veth[i]) == 0 && sh(in + "link set " + veth[i] + " up") == 0 &&
           sh(in + "link set lo up") == 0;
    }
  }
  ~TwoHosts() {
    if (!made) return;
    for (const auto& n : ns) {
      for (int pid : pids(n)) ::kill(pid, SIGKILL);
      sh("ip netns del " + n);
    }
    sh("ip link del " + veth[0]);
  }
  static std::string address(int node) { return "10.77.0." + std::to_string(node + 1); }
  // Processes inside namespace `n`.
  static std::vector<int> pids(const std::string& n) {
    std::vector<int> out;
    FILE* p = ::popen(("ip netns pids " + n + " 2>/dev/null").c_str(), "r");
    if (!p) return out;
    int pid = 0;
    while (std::fscanf(p, "%d", &pid) == 1) out.push_back(pid);
    ::pclose(p);
    return out;
  }

  // Starts `argv` inside node `node`'s namespace with `env` added; its
  // stdout and stderr go to `log`.
  pid_t start(int node, const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
              const std::string& log) const {
    return start_in(node, ns, argv, env, log);
  }
  // The same in namespace ns[node], or here when node < 0.
  static pid_t start_in(int node, const std::vector<std::string>& ns, const std::vector<std::string>& argv,
                        const std::map<std::string, std::string>& env, const std::string& log) {
    const std::string ns_path = node < 0 ? "" : "/run/netns/" + ns[node];
    const pid_t pid = ::fork();
    if (pid == 0) {
      if (!ns_path.empty()) {
        const int fd = ::open(ns_path.c_str(), O_RDONLY | O_CLOEXEC);
        if (fd < 0 || ::setns(fd, CLONE_NEWNET) != 0) ::_exit(126);
      }
      const int out = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(out, 1);
      ::dup2(out, 2);
      for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
      std::vector<char*> args;
      for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      ::execv(args[0], args.data());
      ::_exit(127);
    }
    return pid;
  }

  std::vector<std::string> ns, veth;
  std::string skip_reason;
  bool made = false;
  bool ok = false;
};

// Kills and reaps, at scope exit, the children in `pids` that still run
// (an assertion may end a test early).
struct Reaper {
  ~Reaper() {
    for (pid_t p : pids) {
      int status = 0;
      if (::waitpid(p, &status, WNOHANG) == 0) {
        ::kill(p, SIGKILL);
        ::waitpid(p, &status, 0);
      }
    }
  }
  std::vector<pid_t> pids;
};

// Waits for `pid` up to `limit`; returns its status, or nullopt on timeout.
std::optional<int> wait_for(pid_t pid, std::chrono::seconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid) return status;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return std::nullopt;
}

// The example is built next to this test.
std::string mnist_bin() { return fulgur::testing::program("mnist"); }

// The example's arguments for a short CPU run.
std::vector<std::string> mnist_args(const std::string& dir, int devices, int nodes, int batch, int max_steps) {
  return {mnist_bin(),        "--data-dir",         fulgur::testing::mnist_dir(),
          "--accelerator",    "cpu",                "--strategy",
          devices * nodes > 1 ? "ddp" : "single_device", "--devices", std::to_string(devices),
          "--num-nodes",      std::to_string(nodes), "--batch-size",
          std::to_string(batch), "--train-samples", "2048",
          "--max-epochs",     "1000",               "--max-steps",
          std::to_string(max_steps), "--seed",      "7",
          "--no-test",        "--collective-timeout", "20",
          "--default-root-dir", dir + "/runs",       "--save-weights",
          dir + "/weights"};
}

// Processes anywhere on the machine whose command line contains `part`.
std::vector<int> processes_with(const std::string& part) {
  std::vector<int> out;
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string cmd = read_file((e.path() / "cmdline").string());
    std::replace(cmd.begin(), cmd.end(), '\0', ' ');
    const std::string stat = read_file((e.path() / "stat").string());
    const auto close = stat.rfind(')');
    const bool zombie = close != std::string::npos && close + 2 < stat.size() && stat[close + 2] == 'Z';
    if (!zombie && contains(cmd, part)) out.push_back(std::stoi(name));
  }
  return out;
}

// A TCP port nobody listens on right now.
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

std::map<std::string, std::string> node_env(int node) {
  return {{"MASTER_ADDR", TwoHosts::address(0)}, {"MASTER_PORT", "29500"}, {"NODE_RANK", std::to_string(node)}};
}

std::vector<torch::Tensor> load_weights(const std::string& path) {
  std::vector<torch::Tensor> w;
  torch::load(w, path);
  return w;
}

// Waits until rank 0's progress bar shows training steps (it prints every
// tenth of an epoch when not on a terminal), then a little more.
void wait_for_training(const std::string& log) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < deadline && !contains(read_file(log), "Epoch 0: ")) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
}

// Starts one node of a 2-node x 2-worker MNIST job (`max_steps` steps, output
// under `root`) in each namespace; node N logs to <log_dir>/nodeN.log. The
// launchers' pids go to `reaper`, node 0 first.
void start_two_nodes(TwoHosts& hosts, Reaper& reaper, const std::string& root, const std::string& log_dir,
                     int max_steps) {
  for (int node = 0; node < 2; ++node) {
    reaper.pids.push_back(hosts.start(node, mnist_args(root, 2, 2, 16, max_steps), node_env(node),
                                      log_dir + "/node" + std::to_string(node) + ".log"));
  }
}

#define NEED_TWO_HOSTS(hosts)                                   \
  if (!(hosts).skip_reason.empty()) GTEST_SKIP() << (hosts).skip_reason; \
  ASSERT_TRUE((hosts).ok) << "could not set up the namespaces " << (hosts).ns[0] << " and " << (hosts).ns[1]

}  // namespace

// srun's part played by hand: two forked tasks with SLURM's variables on
// this machine. fulgur starts no process; the tasks meet at the first host of
// the node list, on MASTER_PORT, for fit and then for validate.
TEST(OutsideLauncher, SlurmTasksRunFitThenValidateInTheSameStore) {
  TempDir dir;
  const int port = free_port();
  Reaper reaper;
  std::vector<pid_t>& tasks = reaper.pids;
  for (int r = 0; r < 2; ++r) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      std::string error;
      try {
        for (const auto& [k, v] : std::map<std::string, std::string>{
                 {"SLURM_NTASKS", "2"}, {"SLURM_PROCID", std::to_string(r)}, {"SLURM_LOCALID", std::to_string(r)},
                 {"SLURM_NODEID", "0"}, {"SLURM_NODELIST", "localhost"}, {"SLURM_JOB_NAME", "train"},
                 {"MASTER_PORT", std::to_string(port)}}) {
          setenv(k.c_str(), v.c_str(), 1);
        }
        struct Ranks : fulgur::testing::TinyRegression {
          StepOutput training_step(const Batch& b, int64_t i) override {
            world = trainer()->world_size();
            rank = trainer()->global_rank();
            return TinyRegression::training_step(b, i);
          }
          int64_t world = 0, rank = -1;
        } m;
        Trainer t(TrainerOptions().accelerator("cpu").strategy("ddp").devices(2).max_steps(3)
                      .default_root_dir(dir.path).enable_progress_bar(false).enable_checkpointing(false)
                      .collective_timeout_ms(20000));
        auto data = std::make_shared<DataLoader>(fulgur::testing::regression_data(64), DataLoaderOptions(4));
        t.fit(m, data);
        if (m.world != 2 || m.rank != r) throw std::runtime_error("ranks were not SLURM's");
        t.validate(m, data);
      } catch (const std::exception& e) {
        error = e.what();
      }
      std::ofstream(dir.path + "/task" + std::to_string(r) + ".txt") << error;
      std::fflush(nullptr);
      ::_exit(error.empty() ? 0 : 1);
    }
    tasks.push_back(pid);
  }
  for (int r = 0; r < 2; ++r) {
    auto status = wait_for(tasks[r], std::chrono::seconds(60));
    ASSERT_TRUE(status.has_value()) << "task " << r << " did not finish";
    EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0)
        << "task " << r << ": " << read_file(dir.path + "/task" + std::to_string(r) + ".txt");
  }
}

// Two nodes on one machine (MASTER_ADDR=127.0.0.1, no root needed). Node 1's
// workers fail before training, while node 0's wait in the rendezvous: node
// 0's launcher reads node 1's record in the store and stops its workers
// within the grace period, long before the collective timeout (60 s here).
TEST(TwoNodesOnLoopback, FailureOnOneNodeDuringRendezvousStopsTheOther) {
  TempDir dir;
  const std::string port = std::to_string(free_port());
  Reaper reaper;
  std::vector<pid_t>& nodes = reaper.pids;
  std::vector<std::string> args = mnist_args(dir.path, 2, 2, 16, 6);
  *(std::find(args.begin(), args.end(), "--collective-timeout") + 1) = "60";
  for (int node = 0; node < 2; ++node) {
    std::map<std::string, std::string> env{{"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", port},
                                           {"NODE_RANK", std::to_string(node)}};
    if (node == 1) env["GLOO_SOCKET_IFNAME"] = "nosuch0";
    nodes.push_back(TwoHosts::start_in(-1, {}, args, env, dir.path + "/node" + std::to_string(node) + ".log"));
  }
  auto status1 = wait_for(nodes[1], std::chrono::seconds(60));
  const auto node1_done = std::chrono::steady_clock::now();
  auto status0 = wait_for(nodes[0], std::chrono::seconds(90));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - node1_done).count();
  const std::string log0 = read_file(dir.path + "/node0.log"), log1 = read_file(dir.path + "/node1.log");
  ASSERT_TRUE(status0 && status1) << log0 << "\n---\n" << log1;
  EXPECT_TRUE(WIFEXITED(*status1) && WEXITSTATUS(*status1) != 0) << log1;
  EXPECT_TRUE(WIFEXITED(*status0) && WEXITSTATUS(*status0) != 0) << log0;
  EXPECT_TRUE(contains(log1, "GLOO_SOCKET_IFNAME='nosuch0': this machine has no interface 'nosuch0' with an address; "
                             "interfaces: ")) << log1;
  EXPECT_TRUE(contains(report_line(log0), "node 0 stopped because the job failed on node 1: worker rank ")) << log0;
  EXPECT_TRUE(contains(report_line(log0), "GLOO_SOCKET_IFNAME='nosuch0'")) << log0;
  EXPECT_LT(seconds, 20.0) << "node 0 waited for the collective timeout instead";
  std::printf("node 0 stopped %.1f s after node 1; it reported:\n%s\n", seconds, report_line(log0).c_str());
  EXPECT_TRUE(processes_with(dir.path).empty()) << "a process of the job is left";
}

// Issue 32, item D13 across nodes: once the job has written a last.ckpt, a
// worker of node 1 is SIGKILLed. With --max-restarts 1 on both nodes, each
// launcher stops its workers and starts them again; the new attempt meets
// under keys of its own in node 0's store, resumes from last.ckpt and
// finishes on both nodes. Two nodes of two workers on this machine.
TEST(TwoNodesOnLoopback, KilledWorkerIsRestartedOnBothNodesAndTheJobFinishes) {
  TempDir dir;
  const std::string port = std::to_string(free_port());
  Reaper reaper;
  std::vector<pid_t>& nodes = reaper.pids;
  std::vector<std::string> args = mnist_args(dir.path, 2, 2, 16, 60);
  args.insert(args.end(), {"--max-restarts", "1", "--save-every-n-steps", "5"});
  for (int node = 0; node < 2; ++node) {
    nodes.push_back(TwoHosts::start_in(-1, {}, args,
                                       {{"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", port}, {"NODE_RANK", std::to_string(node)}},
                                       dir.path + "/node" + std::to_string(node) + ".log"));
  }
  const std::string last = dir.path + "/runs/lightning_logs/version_0/checkpoints/last.ckpt";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(90);
  while (!std::filesystem::exists(last) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_TRUE(std::filesystem::exists(last)) << read_file(dir.path + "/node0.log");
  int victim = -1;
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string stat = read_file((e.path() / "stat").string());
    int ppid = 0;
    const auto close = stat.rfind(')');
    if (close != std::string::npos && std::sscanf(stat.c_str() + close + 2, "%*c %d", &ppid) == 1 && ppid == nodes[1]) {
      victim = std::stoi(name);
    }
  }
  ASSERT_GT(victim, 0) << "node 1 has no worker";
  ::kill(victim, SIGKILL);
  auto status0 = wait_for(nodes[0], std::chrono::seconds(120));
  auto status1 = wait_for(nodes[1], std::chrono::seconds(120));
  const std::string log0 = read_file(dir.path + "/node0.log"), log1 = read_file(dir.path + "/node1.log");
  ASSERT_TRUE(status0 && status1) << log0 << "\n---\n" << log1;
  EXPECT_TRUE(WIFEXITED(*status0) && WEXITSTATUS(*status0) == 0) << log0;
  EXPECT_TRUE(WIFEXITED(*status1) && WEXITSTATUS(*status1) == 0) << log1;
  EXPECT_TRUE(contains(log1, "attempt 1 of 2 failed: node 1: worker rank ")) << log1;
  EXPECT_TRUE(contains(log1, "was killed by SIGKILL")) << log1;
  EXPECT_TRUE(contains(log0, "attempt 1 of 2 failed: node 0 ")) << log0;
  EXPECT_TRUE(contains(log0, "restart 1 of the launch: resuming from " + last)) << log0;
  EXPECT_TRUE(contains(log0, "fit stopped at epoch 1, step 60: max_steps=60 reached")) << log0;
  EXPECT_TRUE(processes_with(dir.path).empty()) << "a process of the job is left";
}

// Node 0 dies whole (its launcher, which serves the store, is SIGKILLed):
// node 1's worker fails its collective, says that node 0's store is gone, and
// node 1 exits non-zero at once. Two nodes of one worker on this machine.
TEST(TwoNodesOnLoopback, KilledNodeZeroStopsTheOtherWithItsName) {
  TempDir dir;
  const std::string port = std::to_string(free_port());
  Reaper reaper;
  std::vector<pid_t>& nodes = reaper.pids;
  for (int node = 0; node < 2; ++node) {
    nodes.push_back(TwoHosts::start_in(-1, {}, mnist_args(dir.path, 1, 2, 16, 100000),
                                       {{"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", port},
                                        {"NODE_RANK", std::to_string(node)}},
                                       dir.path + "/node" + std::to_string(node) + ".log"));
  }
  wait_for_training(dir.path + "/node0.log");
  ::kill(nodes[0], SIGKILL);
  const auto killed = std::chrono::steady_clock::now();
  auto status1 = wait_for(nodes[1], std::chrono::seconds(30));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count();
  const std::string log1 = read_file(dir.path + "/node1.log");
  ASSERT_TRUE(status1.has_value()) << "node 1 still runs 30 s after node 0 died:\n" << log1;
  EXPECT_TRUE(WIFEXITED(*status1) && WEXITSTATUS(*status1) != 0) << log1;
  EXPECT_LT(seconds, 15.0) << "beyond the collective timeout";
  EXPECT_TRUE(contains(report_line(log1), "mnist: node 1: worker rank 1 failed first")) << log1;
  EXPECT_TRUE(contains(report_line(log1), "served by the launcher of node 0, does not answer: node 0 has stopped")) << log1;
  std::printf("node 1 stopped %.1f s after node 0 was killed; it reported:\n%s\n", seconds, report_line(log1).c_str());
  wait_for(nodes[0], std::chrono::seconds(5));
  for (int i = 0; i < 50 && !processes_with(dir.path).empty(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_TRUE(processes_with(dir.path).empty()) << "a process of the job is left";
}

TEST(TwoHosts, TwoNodesOfTwoWorkersMatchOneWorkerWithTheSameGlobalBatch) {
  TwoHosts hosts;
  NEED_TWO_HOSTS(hosts);
  TempDir dir;
  const auto start = std::chrono::steady_clock::now();
  Reaper reaper;
  std::vector<pid_t>& nodes = reaper.pids;
  start_two_nodes(hosts, reaper, dir.path + "/two", dir.path, 6);
  const pid_t single = hosts.start(-1, mnist_args(dir.path + "/one", 1, 1, 64, 6), {}, dir.path + "/one.log");
  reaper.pids.push_back(single);
  for (int node = 0; node < 2; ++node) {
    auto status = wait_for(nodes[node], std::chrono::seconds(90));
    const std::string log = read_file(dir.path + "/node" + std::to_string(node) + ".log");
    ASSERT_TRUE(status.has_value()) << "node " << node << " did not finish:\n" << log;
    EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << "node " << node << " (status " << *status << "):\n" << log;
  }
  auto status = wait_for(single, std::chrono::seconds(90));
  ASSERT_TRUE(status && WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << read_file(dir.path + "/one.log");
  std::printf("2 nodes x 2 workers and 1 worker, 6 steps each: %.1f s\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());

  // Rank 0 (on node 0) logged the job's environment; the other ranks do so only at debug level.
  const std::string log0 = read_file(dir.path + "/node0.log"), log1 = read_file(dir.path + "/node1.log");
  EXPECT_TRUE(contains(log0, "cluster environment lightning: world size 4, global rank 0, local rank 0, node rank 0, "
                             "main address 10.77.0.1:29500")) << log0;
  EXPECT_FALSE(contains(log1, "cluster environment")) << log1;
  const auto ref = load_weights(dir.path + "/one/weights/rank-0.pt");
  const auto rank0 = load_weights(dir.path + "/two/weights/rank-0.pt");
  ASSERT_EQ(ref.size(), rank0.size());
  for (int r = 0; r < 4; ++r) {
    const auto w = load_weights(dir.path + "/two/weights/rank-" + std::to_string(r) + ".pt");
    ASSERT_EQ(w.size(), ref.size());
    for (size_t i = 0; i < w.size(); ++i) {
      EXPECT_TRUE(torch::equal(w[i], rank0[i])) << "rank " << r << " parameter " << i << " differs from rank 0";
      EXPECT_TRUE(torch::allclose(w[i], ref[i], 1e-4, 1e-5))
          << "rank " << r << " parameter " << i << ": max difference to one worker "
          << (w[i] - ref[i]).abs().max().item<double>();
    }
  }
  for (const auto& n : hosts.ns) EXPECT_TRUE(TwoHosts::pids(n).empty()) << "a process is left in " << n;
}

// Node 1 dies whole (its launcher is SIGKILLed, its workers follow): node 0's
// workers fail their collective, name node 1 and its ranks, and node 0 exits
// non-zero well within the collective timeout.
TEST(TwoHosts, KilledNodeStopsTheOtherWithItsNameAndRanks) {
  TwoHosts hosts;
  NEED_TWO_HOSTS(hosts);
  TempDir dir;
  Reaper reaper;
  std::vector<pid_t>& nodes = reaper.pids;
  start_two_nodes(hosts, reaper, dir.path, dir.path, 100000);
  wait_for_training(dir.path + "/node0.log");
  ASSERT_FALSE(wait_for(nodes[0], std::chrono::seconds(0)).has_value()) << read_file(dir.path + "/node0.log");
  ::kill(nodes[1], SIGKILL);
  const auto killed = std::chrono::steady_clock::now();
  wait_for(nodes[1], std::chrono::seconds(5));
  auto status = wait_for(nodes[0], std::chrono::seconds(30));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count();
  const std::string log0 = read_file(dir.path + "/node0.log");
  ASSERT_TRUE(status.has_value()) << "node 0 still runs 30 s after node 1 died:\n" << log0;
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) != 0) << log0;
  EXPECT_LT(seconds, 20.0) << "beyond the collective timeout";
  std::printf("node 0 stopped %.1f s after node 1 was killed; it reported:\n%s\n", seconds, report_line(log0).c_str());
  EXPECT_TRUE(contains(log0, "mnist: node 0: worker rank")) << log0;
  EXPECT_TRUE(contains(log0, "ranks that did not arrive: [2, 3] (node 1)")) << log0;
  for (const auto& n : hosts.ns) EXPECT_TRUE(TwoHosts::pids(n).empty()) << "a process is left in " << n;
}

// One worker of node 1 is killed: node 1's launcher records the failure in
// node 0's store, and node 0's report names node 1 and rank 3.
TEST(TwoHosts, KilledWorkerOnOneNodeIsNamedOnTheOther) {
  TwoHosts hosts;
  NEED_TWO_HOSTS(hosts);
  TempDir dir;
  Reaper reaper;
  std::vector<pid_t>& nodes = reaper.pids;
  start_two_nodes(hosts, reaper, dir.path, dir.path, 100000);
  wait_for_training(dir.path + "/node0.log");
  // Rank 3 is node 1's second worker: the launcher's child started last.
  int rank3 = -1;
  unsigned long long latest = 0;
  for (int pid : TwoHosts::pids(hosts.ns[1])) {
    const std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
    int ppid = 0;
    unsigned long long start = 0;
    const auto close = stat.rfind(')');
    if (close == std::string::npos ||
        std::sscanf(stat.c_str() + close + 2, "%*c %d %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %llu",
                    &ppid, &start) != 2) {
      continue;
    }
    if (ppid == nodes[1] && start >= latest) {
      latest = start;
      rank3 = pid;
    }
  }
  ::kill(rank3, SIGKILL);
  auto status0 = wait_for(nodes[0], std::chrono::seconds(30));
  auto status1 = wait_for(nodes[1], std::chrono::seconds(30));
  const std::string log0 = read_file(dir.path + "/node0.log"), log1 = read_file(dir.path + "/node1.log");
  ASSERT_TRUE(status0 && status1) << log0 << "\n---\n" << log1;
  EXPECT_TRUE(WIFEXITED(*status0) && WEXITSTATUS(*status0) != 0) << log0;
  EXPECT_TRUE(WIFEXITED(*status1) && WEXITSTATUS(*status1) != 0) << log1;
  std::printf("node 1 reported:\n%s\nnode 0 reported:\n%s\n", report_line(log1).c_str(), report_line(log0).c_str());
  EXPECT_TRUE(contains(log1, "node 1: worker rank 3 failed first: it was killed by SIGKILL")) << log1;
  EXPECT_TRUE(contains(log0, "node 0 stopped because the job failed on node 1: worker rank 3 was killed by SIGKILL"))
      << log0;
  for (const auto& n : hosts.ns) EXPECT_TRUE(TwoHosts::pids(n).empty()) << "a process is left in " << n;
}
