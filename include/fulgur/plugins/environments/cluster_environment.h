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

// The environment this process runs in.
std::shared_ptr<ClusterEnvironment> detect_cluster_environment();

}  // namespace fulgur
