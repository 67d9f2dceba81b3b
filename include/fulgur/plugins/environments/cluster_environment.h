// SPDX-License-Identifier: Apache-2.0
#pragma once
// ClusterEnvironment: who this process is in the job (ranks, world size,
// where the rendezvous is), read from the environment of its launcher. Each
// answer is read from the variables when asked, so one object made in the
// launching process also answers in the workers it forks. A ParallelStrategy
// holds one (ParallelOptions::cluster_environment, else the one
// detect_cluster_environment() picks when the strategy is made).

#include <cstdint>
#include <memory>
#include <string>

namespace fulgur {

// Where the processes of a job meet to form their process group.
struct RendezvousPoint {
  // Not empty: a FileStore at this path (fulgur's launcher on one node); the
  // fields below are then unused.
  std::string store_path;
  // Else a TCPStore at host:port ...
  std::string host = "127.0.0.1";
  int port = 0;
  // ... served by someone else (node 0's fulgur launcher, torchrun's agent)
  // instead of by global rank 0,
  bool store_served_externally = false;
  // with this job's keys under this prefix (empty: none).
  std::string store_prefix;
  // The address Gloo binds to (FULGUR_BIND_ADDRESS) and the interfaces it may
  // use (GLOO_SOCKET_IFNAME); empty: chosen from `host`.
  std::string bind_address;
  std::string socket_ifname;
};

class ClusterEnvironment {
 public:
  virtual ~ClusterEnvironment() = default;
  virtual std::string name() const = 0;
  // True when an outside launcher (torchrun, SLURM, fulgur's own parent)
  // started this process: then no processes are created here.
  virtual bool creates_processes_externally() const = 0;
  virtual std::string main_address() const = 0;
  virtual int main_port() const = 0;
  virtual int64_t world_size() const = 0;
  virtual int64_t global_rank() const = 0;
  virtual int64_t local_rank() const = 0;
  virtual int64_t node_rank() const = 0;
  // Throws std::invalid_argument when this environment cannot run
  // num_nodes x num_devices processes (the base accepts any).
  virtual void validate_settings(int64_t /*num_devices*/, int64_t /*num_nodes*/) const {}
  // Processes on this node: LOCAL_WORLD_SIZE, 0 when it is not set.
  virtual int64_t local_world_size() const;
  // A TCP store at main_address():main_port() served by global rank 0, with
  // FULGUR_BIND_ADDRESS and GLOO_SOCKET_IFNAME.
  virtual RendezvousPoint rendezvous() const;
};

// torchrun / Lightning names: MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK,
// LOCAL_RANK, LOCAL_WORLD_SIZE, NODE_RANK, NUM_NODES. Without RANK set the
// process is the launching one (rank 0 of 1 until workers exist).
class LightningEnvironment : public ClusterEnvironment {
 public:
  std::string name() const override { return "lightning"; }
  bool creates_processes_externally() const override;
  std::string main_address() const override;
  int main_port() const override;
  int64_t world_size() const override;
  int64_t global_rank() const override;
  int64_t local_rank() const override;
  int64_t node_rank() const override;
  // In a worker of fulgur's launcher, the store it made for the launch (a
  // file store on one node; node 0's TCP store, one key prefix per launch,
  // across nodes); under torchrun's agent store (TORCHELASTIC_USE_AGENT_STORE
  // =True), that store with one prefix per restart; else the default.
  RendezvousPoint rendezvous() const override;
  // NUM_NODES, when set, must be num_nodes. When fulgur's launcher starts the
  // nodes (num_nodes > 1, no RANK set): MASTER_ADDR, MASTER_PORT and
  // NODE_RANK must be set.
  void validate_settings(int64_t num_devices, int64_t num_nodes) const override;
  // Set by the launcher inside a worker.
  static bool is_set();
};

// A worker started by torchrun (torch.distributed.elastic): RANK, GROUP_RANK,
// LOCAL_RANK and LOCAL_WORLD_SIZE are all set. The node rank is GROUP_RANK.
class TorchElasticEnvironment : public LightningEnvironment {
 public:
  std::string name() const override { return "torchelastic"; }
  bool creates_processes_externally() const override { return true; }
  int64_t node_rank() const override;
  static bool detect();
};

// A task started by srun, one task per device: SLURM_PROCID (global rank),
// SLURM_LOCALID, SLURM_NODEID, SLURM_NTASKS (world size). The main address
// is MASTER_ADDR, else the first host of SLURM_NODELIST; the port is
// MASTER_PORT, else 15000 + the last four digits of SLURM_JOB_ID (as
// Lightning). Not detected in an interactive allocation (SLURM_JOB_NAME
// "bash" or "interactive"), where the user starts processes by hand.
class SLURMEnvironment : public ClusterEnvironment {
 public:
  std::string name() const override { return "slurm"; }
  bool creates_processes_externally() const override { return true; }
  std::string main_address() const override;
  int main_port() const override;
  int64_t world_size() const override;
  int64_t global_rank() const override;
  int64_t local_rank() const override;
  int64_t node_rank() const override;
  // SLURM_NTASKS must be num_nodes x num_devices (one task per device).
  void validate_settings(int64_t num_devices, int64_t num_nodes) const override;
  static bool detect();
  // The first host of a SLURM node list: "gpu[03-05,9],cpu1" -> "gpu03".
  static std::string first_host(const std::string& nodelist);
};

// The environment this process runs in: a fulgur worker's own variables
// first (FULGUR_WORKER=1), then SLURM, then torchrun, else Lightning's names.
std::shared_ptr<ClusterEnvironment> detect_cluster_environment();

// One line for the log: name, world size, global/local/node rank and the
// main address:port.
std::string describe(const ClusterEnvironment& env);

}  // namespace fulgur
