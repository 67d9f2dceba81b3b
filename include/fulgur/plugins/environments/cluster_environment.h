#pragma once
// ClusterEnvironment: who this process is in the job (ranks, world size,
// where the rendezvous is), read from the environment of its launcher.

#include <cstdint>
#include <memory>
#include <string>

namespace fulgur {

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
