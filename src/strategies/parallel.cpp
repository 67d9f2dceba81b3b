// SPDX-License-Identifier: Apache-2.0
#include <fulgur/accelerators/accelerator.h>
#include <fulgur/data/device_loader.h>
#include <fulgur/launchers/launcher.h>
#include <fulgur/lightning_module.h>
#include <fulgur/plugins/precision/precision.h>
#include <fulgur/strategies/parallel.h>

#include "serialize/tensor_tree.h"
#include "runtime/log.h"
#include "runtime/threads.h"

#include <torch/torch.h>

#include <exception>
#include <map>
#include <stdexcept>

namespace fulgur {
namespace {

// all_gather whose backward sums, over ranks, the gradient flowing into this
// rank's slice (torch.distributed.nn.functional.all_gather).
//
// The backward returns a tensor of its own, not a view of the reduced buffer:
// AccumulateGrad keeps the gradient, and a view would keep the [world, ...]
// buffer alive as x.grad.
struct AllGatherFn : torch::autograd::Function<AllGatherFn> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& input, Collectives* c) {
    ctx->saved_data["collectives"] = reinterpret_cast<int64_t>(c);
    return c->all_gather(input.detach());
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* c = reinterpret_cast<Collectives*>(ctx->saved_data["collectives"].toInt());
    at::Tensor g = grads[0].contiguous().clone();
    c->all_reduce(g, ReduceOp::kSum);
    return {g.select(0, c->rank()).clone(), at::Tensor()};
  }
};

}  // namespace

ParallelStrategy::ParallelStrategy(std::shared_ptr<Accelerator> accelerator, std::vector<int64_t> parallel_devices,
                                   std::shared_ptr<CheckpointIO> checkpoint_io, std::shared_ptr<Precision> precision,
                                   ParallelOptions options)
    : Strategy(std::move(accelerator), std::move(checkpoint_io), std::move(precision)),
      parallel_devices_(std::move(parallel_devices)), options_(std::move(options)) {
  if (parallel_devices_.empty()) throw std::invalid_argument("ParallelStrategy: parallel_devices is empty");
  if (options_.num_nodes() < 1) throw std::invalid_argument("num_nodes=" + std::to_string(options_.num_nodes()) + " must be >= 1");
  auto lo = MultiProcessLauncherOptions()
                .num_processes(static_cast<int64_t>(parallel_devices_.size()))
                .num_nodes(options_.num_nodes())
                .start_method(options_.start_method())
                .grace_period(options_.grace_period())
                .stop_timeout(options_.stop_timeout())
                .max_restarts(options_.max_restarts());
  cluster_environment_ = options_.cluster_environment() ? options_.cluster_environment() : detect_cluster_environment();
  const ClusterEnvironment& env = *cluster_environment_;
  env.validate_settings(lo.num_processes(), options_.num_nodes());
  lo.node_rank(env.node_rank())
      .main_address(env.main_address())
      .main_port(env.main_port())
      .processes_created_externally(env.creates_processes_externally());
  if (lo.node_rank() >= options_.num_nodes()) {
    throw std::invalid_argument("NODE_RANK=" + std::to_string(lo.node_rank()) + " is outside [0, " +
                                std::to_string(options_.num_nodes()) + ")");
  }
  launcher_ = std::make_unique<MultiProcessLauncher>(lo);
}

ParallelStrategy::~ParallelStrategy() = default;

Launcher* ParallelStrategy::launcher() { return launcher_.get(); }
int64_t ParallelStrategy::global_rank() const { return launched_ ? rank_ : 0; }
int64_t ParallelStrategy::local_rank() const { return launched_ ? local_rank_ : 0; }
int64_t ParallelStrategy::node_rank() const { return launched_ ? node_rank_ : 0; }
int64_t ParallelStrategy::world_size() const { return launched_ ? world_size_ : 1; }

// Local rank k owns the k-th device of the node's parallel_devices ("1,3": rank 0 gets device 1),
// as Lightning's parallel_devices[local_rank]; an externally started process with a local rank
// beyond the list (a launcher that knows more devices than this strategy was told) takes its own index.
c10::Device ParallelStrategy::root_device() const {
  const int64_t k = local_rank();
  const int64_t index = k < static_cast<int64_t>(parallel_devices_.size()) ? parallel_devices_[static_cast<size_t>(k)] : k;
  return accelerator_->device(index);
}

void ParallelStrategy::setup_environment() {
  const ClusterEnvironment& env = *cluster_environment_;
  rank_ = env.global_rank();
  local_rank_ = env.local_rank();
  node_rank_ = env.node_rank();
  world_size_ = env.world_size();
  const RendezvousPoint where = env.rendezvous();
  std::string who = describe(env);
  const auto address = who.rfind(", main address");
  if (!where.store_path.empty() && address != std::string::npos) {
    // One node, fulgur's launcher: the rendezvous is a file store, no address or port is used.
    who.erase(address) += ", rendezvous in a private file store";
  }
  // Every rank's line is there at debug level; rank 0's is enough otherwise, once per run (each
  // stage's workers would repeat it).
  if (rank_ == 0) {
    runtime::info_rank_zero_once(who);
  } else {
    runtime::log(runtime::LogLevel::kDebug, who);
  }
  const int64_t local_world = env.local_world_size() > 0 ? env.local_world_size() : static_cast<int64_t>(parallel_devices_.size());
  runtime::apply_thread_policy(local_world);
  auto ro = RendezvousOptions()
                .rank(rank_)
                .world_size(world_size_)
                .timeout(options_.timeout())
                .debug(options_.debug())
                .local_world_size(local_world)
                .store_path(where.store_path);
  if (where.store_path.empty()) {
    ro.host(where.host)
        .port(where.port)
        .store_served_externally(where.store_served_externally)
        .store_prefix(where.store_prefix)
        .bind_address(where.bind_address)
        .socket_ifname(where.socket_ifname);
  }
  collectives_ = Collectives::create(ro);
  launched_ = true;
  accelerator_->setup_device(root_device());
}

void ParallelStrategy::setup_module_states() {
  if (options_.sync_module_states()) sync_module_states();
}

void ParallelStrategy::sync_module_states() {
  if (!collectives_ || world_size() == 1) return;
  torch::NoGradGuard no_grad;
  std::map<c10::ScalarType, std::vector<at::Tensor>> groups;
  for (auto& p : model_->parameters(true)) groups[p.scalar_type()].push_back(p);
  for (auto& b : model_->buffers(true)) groups[b.scalar_type()].push_back(b);
  for (auto& [dtype, ts] : groups) {
    std::vector<at::Tensor> flat_parts;
    for (auto& t : ts) flat_parts.push_back(t.to(torch::kCPU).reshape({-1}));
    at::Tensor flat = torch::cat(flat_parts);
    collectives_->broadcast(flat, 0);
    int64_t off = 0;
    for (auto& t : ts) {
      t.copy_(flat.narrow(0, off, t.numel()).view(t.sizes()).to(t.device()));
      off += t.numel();
    }
  }
}

void ParallelStrategy::teardown() {
  if (collectives_) collectives_->shutdown();
  collectives_.reset();
  launched_ = false;
  Strategy::teardown();
}

at::Tensor ParallelStrategy::reduce(const at::Tensor& tensor, const std::string& reduce_op) {
  const ReduceOp op = parse_reduce_op(reduce_op);
  if (!collectives_) return Strategy::reduce(tensor, reduce_op);
  at::Tensor out = tensor.detach().clone();
  collectives_->all_reduce(out, op);  // stages other devices through the CPU
  return out;
}

at::Tensor ParallelStrategy::all_gather(const at::Tensor& tensor, bool sync_grads) {
  if (!tensor.defined()) throw std::invalid_argument("all_gather: the tensor is undefined");
  if (!collectives_) return tensor;
  if (sync_grads) return AllGatherFn::apply(tensor, collectives_.get());
  return collectives_->all_gather(tensor.detach());
}

c10::IValue ParallelStrategy::broadcast(const c10::IValue& value, int64_t src) {
  if (!collectives_) return Strategy::broadcast(value, src);
  if (src < 0 || src >= world_size()) {
    throw std::invalid_argument("broadcast: src=" + std::to_string(src) + " is outside [0, " + std::to_string(world_size()) + ")");
  }
  // Tensors travel as CPU tensors, with one flag each (in visiting order):
  // whether it was on src's root device. Receivers put those on theirs and
  // leave the others on the CPU, so every rank has each tensor where it started.
  c10::List<int64_t> on_device;
  detail::map_tensors(value, [&](const at::Tensor& t) {
    on_device.push_back(t.device().is_cpu() ? 0 : 1);
    return t;
  });
  c10::IValue out = collectives_->broadcast_object(c10::ivalue::Tuple::create({to_cpu(value), on_device}), src);
  if (global_rank() == src) return value;
  const auto& parts = out.toTupleRef().elements();
  const c10::List<int64_t> flags = parts.at(1).toIntList();
  const c10::Device dev = root_device();
  size_t i = 0;
  return detail::map_tensors(parts.at(0), [&](const at::Tensor& t) {
    if (i >= flags.size()) throw CollectiveError("broadcast: rank " + std::to_string(src) + " sent more tensors than flags");
    return flags.get(i++) ? t.to(dev) : t;
  });
}

int64_t ParallelStrategy::count_true(bool decision) {
  if (!collectives_) return Strategy::count_true(decision);
  at::Tensor t = torch::tensor(decision ? 1 : 0, torch::kInt32);
  collectives_->all_reduce_async(t, ReduceOp::kSum)->wait();
  return t.item<int64_t>();
}

void ParallelStrategy::barrier(const std::string& name) {
  if (collectives_) collectives_->barrier(name);
}

void ParallelStrategy::save_checkpoint(const Checkpoint& checkpoint, const std::string& path,
                                       const StorageOptions& storage_options) {
  if (!collectives_ || world_size() == 1) return Strategy::save_checkpoint(checkpoint, path, storage_options);
  // Rank 0 writes; then every rank learns whether it failed, and why.
  std::exception_ptr failure;
  std::string kind, message;
  if (is_global_zero()) {
    try {
      checkpoint_io().save_checkpoint(checkpoint, path, storage_options);
    } catch (const std::invalid_argument& e) {
      failure = std::current_exception();
      kind = "invalid_argument";
      message = e.what();
    } catch (const std::exception& e) {
      failure = std::current_exception();
      kind = "error";
      message = e.what();
    }
  }
  const c10::IValue outcome = collectives_->broadcast_object(c10::ivalue::Tuple::create({kind, message}), 0);
  if (failure) std::rethrow_exception(failure);
  const auto& parts = outcome.toTupleRef().elements();
  const std::string& remote_kind = parts.at(0).toStringRef();
  if (remote_kind.empty()) return;
  const std::string what = "save_checkpoint('" + path + "') failed on rank 0, which writes: " + parts.at(1).toStringRef();
  if (remote_kind == "invalid_argument") throw std::invalid_argument(what);
  throw std::runtime_error(what);
}

namespace {

// Whether `source` is what process_dataloader made for `world` ranks: a
// DataLoader with such a DistributedSampler, maybe inside DeviceLoaders.
bool sharded_for(const BatchSource& source, int64_t world) {
  if (const auto* device = dynamic_cast<const DeviceLoader*>(&source)) return sharded_for(*device->inner(), world);
  const auto* dl = dynamic_cast<const DataLoader*>(&source);
  const auto* sampler = dl ? dynamic_cast<const DistributedSampler*>(&dl->sampler()) : nullptr;
  return sampler && sampler->options().num_replicas() == world;
}

}  // namespace

std::shared_ptr<BatchSource> ParallelStrategy::process_dataloader(std::shared_ptr<BatchSource> loader) {
  // This rank's share, then (on a CUDA device) a DeviceLoader that copies it to the device.
  return detail::cuda_device_loader(shard_dataloader(std::move(loader)), root_device());
}

std::shared_ptr<BatchSource> ParallelStrategy::shard_dataloader(std::shared_ptr<BatchSource> loader) {
  if (world_size() == 1 || !options_.use_distributed_sampler() || sharded_for(*loader, world_size())) return loader;
  auto dl = std::dynamic_pointer_cast<DataLoader>(loader);
  if (!dl) {
    const bool device = std::dynamic_pointer_cast<DeviceLoader>(loader) != nullptr;
    throw std::invalid_argument(
        std::string("process_dataloader: the loader is ") +
        (device ? "a DeviceLoader over a source that is not a sharded DataLoader" : "not a DataLoader") +
        ", so it cannot be given a DistributedSampler, and each of the " + std::to_string(world_size()) +
        " ranks would train on all of it. Pass a DataLoader over a Dataset (the strategy gives each rank its share" +
        (device ? " and wraps it for the device itself" : "") +
        "), or make the source yield only this rank's share (trainer.global_rank() of world_size()) and set "
        "TrainerOptions().use_distributed_sampler(false) (ParallelOptions::use_distributed_sampler for a strategy "
        "object)");
  }
  // drop_last: as Lightning, the sampler pads; the loader's drop_last applies to batches.
  const auto so = DistributedSampler::Options()
                      .num_replicas(world_size())
                      .rank(global_rank())
                      .shuffle(dl->options().shuffle())
                      .seed(dl->options().seed())
                      .drop_last(false);
  return dl->with_sampler(std::make_shared<DistributedSampler>(dl->dataset()->size(), so));
}

}  // namespace fulgur
