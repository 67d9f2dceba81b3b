// SPDX-License-Identifier: Apache-2.0
#pragma once
// ParallelStrategy: one process per device, over one or several nodes: the
// cluster environment, the launcher, ranks, the process group and its
// collectives, the distributed sampler. DDPStrategy (ddp.h) and XLAStrategy
// (xla.h) derive from it.

#include <fulgur/distributed/collectives.h>
#include <fulgur/plugins/environments/cluster_environment.h>
#include <fulgur/strategies/ddp_comm_hook.h>
#include <fulgur/strategies/strategy.h>

#include <torch/arg.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace fulgur {

// How a ParallelStrategy (DDPStrategy, XLAStrategy) runs its processes.
//
// Example:
//   fulgur::ParallelOptions().num_nodes(2).timeout(std::chrono::minutes(5))
struct ParallelOptions {
  // Bound on each collective and on the rendezvous.
  TORCH_ARG(std::chrono::milliseconds, timeout) = std::chrono::minutes(30);
  // Log each collective and check all ranks call the same one.
  TORCH_ARG(bool, debug) = false;
  // Broadcast every parameter and buffer from rank 0 at setup.
  TORCH_ARG(bool, sync_module_states) = true;
  TORCH_ARG(int64_t, num_nodes) = 1;
  // "fork" or "spawn".
  TORCH_ARG(std::string, start_method) = "fork";
  // Between SIGTERM and SIGKILL when a worker fails.
  TORCH_ARG(std::chrono::milliseconds, grace_period) = std::chrono::milliseconds(5000);
  // After a stop signal: how long the workers get to save and exit (see
  // MultiProcessLauncherOptions::stop_timeout).
  TORCH_ARG(std::chrono::milliseconds, stop_timeout) = std::chrono::milliseconds(30000);
  // How many times a failed job is started again, a fit resuming from the
  // run's last.ckpt (see MultiProcessLauncherOptions::max_restarts). Default
  // 0; negative: std::invalid_argument when the strategy is made.
  TORCH_ARG(int64_t, max_restarts) = 0;
  // process_dataloader shards DataLoaders and refuses other sources; false:
  // every loader is used as given (it must shard itself).
  TORCH_ARG(bool, use_distributed_sampler) = true;
  // Where ranks, world size, main address and port and the rendezvous come
  // from. nullptr: the one detect_cluster_environment() picks when the
  // strategy is made. The strategy holds it for its lifetime, in the
  // workers too: one that does not create its processes itself must answer
  // there from the names fulgur's launcher sets (LightningEnvironment's).
  TORCH_ARG(std::shared_ptr<ClusterEnvironment>, cluster_environment) = nullptr;
  // The gradient all-reduce's encoding (Lightning's DDPStrategy(ddp_comm_hook=...)),
  // for DDPStrategy's buckets during backward and XLAStrategy's buffers at the
  // step alike. Default kNone: exact float32 sums. kBf16Compress halves the
  // bytes sent for a loss of gradient precision (see DDPCommHook).
  TORCH_ARG(DDPCommHook, ddp_comm_hook) = DDPCommHook::kNone;
};

class ParallelStrategy : public Strategy {
 public:
  ParallelStrategy(std::shared_ptr<Accelerator> accelerator, std::vector<int64_t> parallel_devices,
                   std::shared_ptr<CheckpointIO> checkpoint_io, std::shared_ptr<Precision> precision,
                   ParallelOptions options);
  ~ParallelStrategy() override;

  Launcher* launcher() override;
  int64_t global_rank() const override;
  int64_t local_rank() const override;
  int64_t node_rank() const override;
  int64_t world_size() const override;
  c10::Device root_device() const override;
  const std::vector<int64_t>& parallel_devices() const { return parallel_devices_; }
  const ParallelOptions& parallel_options() const { return options_; }
  // Held from construction; asked for ranks and the rendezvous in setup_environment.
  const ClusterEnvironment& cluster_environment() const { return *cluster_environment_; }
  // The process group (nullptr before launch).
  const std::shared_ptr<Collectives>& collectives() const { return collectives_; }

  void setup_environment() override;
  void setup_module_states() override;
  void teardown() override;

  // Both Strategy::reduce overloads stay callable on a ParallelStrategy.
  using Strategy::reduce;
  at::Tensor reduce(const at::Tensor& tensor, const std::string& reduce_op = "mean") override;
  at::Tensor all_gather(const at::Tensor& tensor, bool sync_grads = false) override;
  c10::IValue broadcast(const c10::IValue& value, int64_t src = 0) override;
  void barrier(const std::string& name = "") override;
  // Rank 0 writes; every rank must call. When rank 0's write fails (the
  // CheckpointIO refuses storage_options, the disk is full), every rank
  // throws: rank 0 its own exception, the others the same type
  // (std::invalid_argument, else std::runtime_error) with rank 0's message.
  void save_checkpoint(const Checkpoint& checkpoint, const std::string& path,
                       const StorageOptions& storage_options = {}) override;
  // On several ranks: gives a DataLoader a DistributedSampler for this rank;
  // returns what it made before unchanged; throws std::invalid_argument for
  // any other source (or a DeviceLoader over one), which each rank would use
  // whole. With use_distributed_sampler off, returns every loader unchanged.
  // On a CUDA root device the result comes inside a DeviceLoader (see
  // Strategy::process_dataloader).
  std::shared_ptr<BatchSource> process_dataloader(std::shared_ptr<BatchSource> loader) override;

 protected:
  // process_dataloader's sharding, without the device.
  std::shared_ptr<BatchSource> shard_dataloader(std::shared_ptr<BatchSource> loader);
  // Every parameter and buffer takes rank 0's value (flattened, one broadcast per dtype).
  void sync_module_states();
  // One all-reduce without the shape check (the trainer asks every few steps
  // whether a rank received a stop signal).
  int64_t count_true(bool decision) override;

  std::vector<int64_t> parallel_devices_;
  ParallelOptions options_;
  std::shared_ptr<ClusterEnvironment> cluster_environment_;
  std::unique_ptr<Launcher> launcher_;
  std::shared_ptr<Collectives> collectives_;
  bool launched_ = false;
  int64_t rank_ = 0, local_rank_ = 0, node_rank_ = 0, world_size_ = 1;
};

}  // namespace fulgur
