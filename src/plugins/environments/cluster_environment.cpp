// SPDX-License-Identifier: Apache-2.0
#include <fulgur/plugins/environments/cluster_environment.h>

#include "launchers/worker_env.h"
#include "runtime/env.h"

#include <cstdlib>
#include <stdexcept>
#include <string>

namespace fulgur {
namespace {

using runtime::env_int;
using runtime::env_port;
const char* env(const char* name) { return runtime::env_value(name); }

}  // namespace

int64_t ClusterEnvironment::local_world_size() const { return env_int("LOCAL_WORLD_SIZE", 0); }

RendezvousPoint ClusterEnvironment::rendezvous() const {
  RendezvousPoint p;
  p.host = main_address();
  p.port = main_port();
  p.bind_address = runtime::env_string("FULGUR_BIND_ADDRESS");
  p.socket_ifname = runtime::env_string("GLOO_SOCKET_IFNAME");
  return p;
}

RendezvousPoint LightningEnvironment::rendezvous() const {
  if (const char* store = env(detail::kStoreEnv)) {
    RendezvousPoint p;
    p.store_path = store;
    return p;
  }
  RendezvousPoint p = ClusterEnvironment::rendezvous();
  if (runtime::env_set(detail::kParentStoreEnv)) {
    p.store_served_externally = true;
    runtime::env_required(detail::kLaunchIndexEnv, "a worker of a launch across nodes");  // throws when unset
    p.store_prefix = detail::launch_store_prefix(env_int(detail::kLaunchIndexEnv, 0), env_int(detail::kRestartCountEnv, 0));
  } else if (runtime::env_string("TORCHELASTIC_USE_AGENT_STORE") == "True") {
    // The agent's store outlives restarts: each attempt has its own keys, as in torch.distributed.
    p.store_served_externally = true;
    if (const char* attempt = env("TORCHELASTIC_RESTART_COUNT")) p.store_prefix = std::string("/worker/attempt_") + attempt;
  }
  return p;
}

void LightningEnvironment::validate_settings(int64_t /*num_devices*/, int64_t num_nodes) const {
  if (const char* nodes = env("NUM_NODES"); nodes && std::to_string(num_nodes) != nodes) {
    throw std::invalid_argument("num_nodes=" + std::to_string(num_nodes) + " but the environment has NUM_NODES=" + nodes +
                                "; pass the same node count to the Trainer (--num-nodes in the examples) or unset NUM_NODES");
  }
  if (num_nodes <= 1 || creates_processes_externally()) return;
  if (!env("MASTER_ADDR") || !env("MASTER_PORT") || !env("NODE_RANK")) {
    throw std::invalid_argument("num_nodes=" + std::to_string(num_nodes) +
                                " needs MASTER_ADDR and MASTER_PORT (node 0's address and a free port, the same on every "
                                "node) and NODE_RANK (0 to " + std::to_string(num_nodes - 1) +
                                ", different on each node) in the environment of every node");
  }
}

bool LightningEnvironment::is_set() { return env("RANK") != nullptr || env("LOCAL_RANK") != nullptr; }

bool LightningEnvironment::creates_processes_externally() const { return is_set(); }

std::string LightningEnvironment::main_address() const {
  const char* v = env("MASTER_ADDR");
  return v ? v : "127.0.0.1";
}

int LightningEnvironment::main_port() const { return env_port("MASTER_PORT", 0); }

int64_t LightningEnvironment::world_size() const { return env_int("WORLD_SIZE", 1); }

int64_t LightningEnvironment::global_rank() const { return env_int("RANK", 0); }

int64_t LightningEnvironment::local_rank() const { return env_int("LOCAL_RANK", 0); }

int64_t LightningEnvironment::node_rank() const { return env_int("NODE_RANK", env_int("GROUP_RANK", 0)); }

bool TorchElasticEnvironment::detect() {
  return env("RANK") && env("GROUP_RANK") && env("LOCAL_RANK") && env("LOCAL_WORLD_SIZE");
}

int64_t TorchElasticEnvironment::node_rank() const { return env_int("GROUP_RANK", 0); }

bool SLURMEnvironment::detect() {
  if (!env("SLURM_NTASKS")) return false;
  const char* job = env("SLURM_JOB_NAME");
  const std::string name = job ? job : "";
  return name != "bash" && name != "interactive";
}

std::string SLURMEnvironment::first_host(const std::string& nodelist) {
  // The first entry of the comma list, commas inside brackets excluded.
  int depth = 0;
  size_t end = 0;
  for (; end < nodelist.size(); ++end) {
    const char c = nodelist[end];
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if ((c == ',' || c == ' ') && depth == 0) break;
  }
  const std::string entry = nodelist.substr(0, end);
  // Each bracketed range keeps its first value: "n[03-05,9]-ib" -> "n03-ib".
  std::string host;
  for (size_t i = 0; i < entry.size(); ++i) {
    if (entry[i] != '[') {
      host += entry[i];
      continue;
    }
    const size_t close = entry.find(']', i);
    if (close == std::string::npos) {
      throw std::invalid_argument("SLURM_NODELIST='" + nodelist + "' has an unclosed '['; expected e.g. node[01-04]");
    }
    const std::string range = entry.substr(i + 1, close - i - 1);
    host += range.substr(0, range.find_first_of(",-"));
    i = close;
  }
  if (host.empty()) throw std::invalid_argument("SLURM_NODELIST='" + nodelist + "' names no host");
  return host;
}

std::string SLURMEnvironment::main_address() const {
  if (const char* v = env("MASTER_ADDR")) return v;
  const char* nodes = env("SLURM_NODELIST");
  if (!nodes) nodes = env("SLURM_JOB_NODELIST");
  if (!nodes) throw std::invalid_argument("SLURM: neither MASTER_ADDR nor SLURM_NODELIST is set; set MASTER_ADDR to node 0's address");
  return first_host(nodes);
}

int SLURMEnvironment::main_port() const {
  if (env("MASTER_PORT")) return env_port("MASTER_PORT", 0);
  const char* job = env("SLURM_JOB_ID");
  if (!job) return 12910;
  const std::string id = job;
  const std::string tail = id.size() > 4 ? id.substr(id.size() - 4) : id;
  char* end = nullptr;
  const long n = std::strtol(tail.c_str(), &end, 10);
  if (*end != '\0' || n < 0) throw std::invalid_argument("SLURM_JOB_ID='" + id + "' must end in digits; set MASTER_PORT");
  return static_cast<int>(15000 + n);
}

void SLURMEnvironment::validate_settings(int64_t num_devices, int64_t num_nodes) const {
  const int64_t processes = num_devices * num_nodes;
  if (world_size() == processes) return;
  throw std::invalid_argument("SLURM started SLURM_NTASKS=" + std::to_string(world_size()) +
                              " tasks but the Trainer asks for num_nodes=" + std::to_string(num_nodes) +
                              " x devices=" + std::to_string(num_devices) + " = " + std::to_string(processes) +
                              " processes; start one task per device (sbatch --nodes=" + std::to_string(num_nodes) +
                              " --ntasks-per-node=" + std::to_string(num_devices) + ")");
}

int64_t SLURMEnvironment::world_size() const { return env_int("SLURM_NTASKS", 1); }

int64_t SLURMEnvironment::global_rank() const { return env_int("SLURM_PROCID", 0); }

int64_t SLURMEnvironment::local_rank() const { return env_int("SLURM_LOCALID", 0); }

int64_t SLURMEnvironment::node_rank() const { return env_int("SLURM_NODEID", 0); }

std::shared_ptr<ClusterEnvironment> detect_cluster_environment() {
  const char* worker = env(detail::kWorkerEnv);
  if (worker && std::string(worker) == "1") return std::make_shared<LightningEnvironment>();
  if (SLURMEnvironment::detect()) return std::make_shared<SLURMEnvironment>();
  if (TorchElasticEnvironment::detect()) return std::make_shared<TorchElasticEnvironment>();
  return std::make_shared<LightningEnvironment>();
}

std::string describe(const ClusterEnvironment& e) {
  return "cluster environment " + e.name() + ": world size " + std::to_string(e.world_size()) + ", global rank " +
         std::to_string(e.global_rank()) + ", local rank " + std::to_string(e.local_rank()) + ", node rank " +
         std::to_string(e.node_rank()) + ", main address " + e.main_address() + ":" + std::to_string(e.main_port());
}

}  // namespace fulgur
