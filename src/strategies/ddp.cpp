#include <fulgur/data/device_loader.h>
#include <fulgur/strategies/ddp.h>
#include <fulgur/trainer.h>

#include "distributed/gradient_sync.h"
#include "strategies/xla_common.h"
#include "runtime/log.h"
#include "runtime/threads.h"
#include "trainer/trainer_impl.h"
#include <fulgur/xla/backend.h>

#include <torch/torch.h>

#include <cstdlib>
#include <exception>
#include <functional>
#include <iostream>
#include <map>
#include <stdexcept>

namespace fulgur {
namespace {

// all_gather whose backward sums, over ranks, the gradient flowing into this
// rank's slice (torch.distributed.nn.functional.all_gather).
//
// The backward reduces a CPU copy and returns a tensor of its own, never a
// view of the reduced buffer: AccumulateGrad detaches the gradient it keeps,
// and in libtorch 1.13 the detached view of a lazy tensor that was updated
// in place reads as its whole base (x.grad of shape [2] held the [world, 2]
// sum). On the CPU a view would keep the [world, ...] buffer alive as x.grad.
struct AllGatherFn : torch::autograd::Function<AllGatherFn> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& input, Collectives* c) {
    ctx->saved_data["collectives"] = reinterpret_cast<int64_t>(c);
    return c->all_gather(input.detach());
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* c = reinterpret_cast<Collectives*>(ctx->saved_data["collectives"].toInt());
    at::Tensor g = grads[0].to(torch::kCPU).contiguous().clone();
    c->all_reduce(g, ReduceOp::kSum);
    return {g.select(0, c->rank()).clone().to(grads[0].device()), at::Tensor()};
  }
};

// `value` with every tensor inside (dicts, lists, tuples, nested) replaced by
// f(tensor), visited depth first in container order.
c10::IValue visit_tensors(const c10::IValue& v, const std::function<at::Tensor(const at::Tensor&)>& f) {
  if (v.isTensor()) return f(v.toTensor());
  if (v.isGenericDict()) {
    auto in = v.toGenericDict();
    c10::impl::GenericDict d(in.keyType(), in.valueType());
    for (const auto& kv : in) d.insert(kv.key(), visit_tensors(kv.value(), f));
    return d;
  }
  if (v.isList()) {
    c10::impl::GenericList l(v.toList().elementType());
    for (const auto& e : v.toList()) l.push_back(visit_tensors(e, f));
    return l;
  }
  if (v.isTuple()) {
    std::vector<c10::IValue> items;
    for (const auto& e : v.toTupleRef().elements()) items.push_back(visit_tensors(e, f));
    return c10::ivalue::Tuple::create(std::move(items));
  }
  return v;
}

bool env_set(const char* name) {
  const char* v = std::getenv(name);
  return v && *v;
}

}  // namespace

// --- ParallelStrategy -----------------------------------------------------

ParallelStrategy::ParallelStrategy(std::shared_ptr<Accelerator> accelerator, std::vector<int64_t> parallel_devices,
                                   std::shared_ptr<CheckpointIO> checkpoint_io, std::shared_ptr<Precision> precision,
                                   ParallelOptions options)
    : Strategy(std::move(accelerator), std::move(checkpoint_io), std::move(precision)),
      parallel_devices_(std::move(parallel_devices)), options_(std::move(options)) {
  if (parallel_devices_.empty()) throw std::invalid_argument("ParallelStrategy: parallel_devices is empty");
  if (options_.num_nodes < 1) throw std::invalid_argument("num_nodes=" + std::to_string(options_.num_nodes) + " must be >= 1");
  MultiProcessLauncherOptions lo;
  lo.num_processes = static_cast<int64_t>(parallel_devices_.size());
  lo.num_nodes = options_.num_nodes;
  lo.start_method = options_.start_method;
  lo.grace_period = options_.grace_period;
  lo.stop_timeout = options_.stop_timeout;
  const auto env = detect_cluster_environment();
  const int64_t processes = lo.num_processes * options_.num_nodes;
  if (env->name() == "slurm" && env->world_size() != processes) {
    throw std::invalid_argument("SLURM started SLURM_NTASKS=" + std::to_string(env->world_size()) +
                                " tasks but the Trainer asks for num_nodes=" + std::to_string(options_.num_nodes) +
                                " x devices=" + std::to_string(lo.num_processes) + " = " + std::to_string(processes) +
                                " processes; start one task per device (sbatch --nodes=" + std::to_string(options_.num_nodes) +
                                " --ntasks-per-node=" + std::to_string(lo.num_processes) + ")");
  }
  lo.node_rank = env->node_rank();
  lo.main_address = env->main_address();
  lo.main_port = env->main_port();
  const bool launches_nodes = options_.num_nodes > 1 && !env->creates_processes_externally();
  if (launches_nodes && (!env_set("MASTER_ADDR") || !env_set("MASTER_PORT") || !env_set("NODE_RANK"))) {
    throw std::invalid_argument("num_nodes=" + std::to_string(options_.num_nodes) +
                                " needs MASTER_ADDR and MASTER_PORT (node 0's address and a free port, the same on every "
                                "node) and NODE_RANK (0 to " + std::to_string(options_.num_nodes - 1) +
                                ", different on each node) in the environment of every node");
  }
  if (lo.node_rank >= options_.num_nodes) {
    throw std::invalid_argument("NODE_RANK=" + std::to_string(lo.node_rank) + " is outside [0, " +
                                std::to_string(options_.num_nodes) + ")");
  }
  launcher_ = std::make_unique<MultiProcessLauncher>(lo);
}

ParallelStrategy::~ParallelStrategy() = default;

Launcher* ParallelStrategy::launcher() { return launcher_.get(); }
int64_t ParallelStrategy::global_rank() const { return launched_ ? rank_ : 0; }
int64_t ParallelStrategy::local_rank() const { return launched_ ? local_rank_ : 0; }
int64_t ParallelStrategy::node_rank() const { return launched_ ? node_rank_ : 0; }
int64_t ParallelStrategy::world_size() const { return launched_ ? world_size_ : 1; }

c10::Device ParallelStrategy::root_device() const { return accelerator_->device(local_rank()); }

void ParallelStrategy::setup_environment() {
  const auto env = detect_cluster_environment();
  rank_ = env->global_rank();
  local_rank_ = env->local_rank();
  node_rank_ = env->node_rank();
  world_size_ = env->world_size();
  std::string who = describe(*env);
  const auto address = who.rfind(", main address");
  if (const char* store = std::getenv("FULGUR_STORE"); store && *store && address != std::string::npos) {
    // One node, fulgur's launcher: the rendezvous is a file store, no address or port is used.
    who.erase(address) += ", rendezvous in a private file store";
  }
  // Every rank's line is there at debug level; rank 0's is enough otherwise.
  if (rank_ == 0) {
    runtime::log_rank_zero(runtime::LogLevel::kInfo, who);
  } else {
    runtime::log(runtime::LogLevel::kDebug, who);
  }
  const char* lws = std::getenv("LOCAL_WORLD_SIZE");
  const int64_t local_world = lws && *lws ? std::atoll(lws) : static_cast<int64_t>(parallel_devices_.size());
  runtime::apply_thread_policy(local_world);
  RendezvousOptions ro;
  ro.rank = rank_;
  ro.world_size = world_size_;
  ro.timeout = options_.timeout;
  ro.debug = options_.debug;
  ro.local_world_size = local_world;
  if (const char* store = std::getenv("FULGUR_STORE"); store && *store) {
    ro.store_path = store;
  } else {
    ro.host = env->main_address();
    ro.port = env->main_port();
    const char* agent = std::getenv("TORCHELASTIC_USE_AGENT_STORE");
    // Across nodes, fulgur's launcher on node 0 serves the store, one key prefix per launch.
    const bool parent = env_set("FULGUR_PARENT_STORE");
    ro.store_served_externally = (agent && std::string(agent) == "True") || parent;
    if (parent) ro.store_prefix = std::string("launch-") + std::getenv("FULGUR_LAUNCH_INDEX");
    // torchrun's agent store outlives restarts: each attempt has its own keys, as in torch.distributed.
    if (const char* attempt = std::getenv("TORCHELASTIC_RESTART_COUNT"); !parent && ro.store_served_externally && attempt) {
      ro.store_prefix = std::string("/worker/attempt_") + attempt;
    }
    if (const char* bind = std::getenv("FULGUR_BIND_ADDRESS"); bind && *bind) ro.bind_address = bind;
    if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname && *ifname) ro.socket_ifname = ifname;
  }
  collectives_ = Collectives::create(ro);
  launched_ = true;
  accelerator_->setup_device(root_device());
}

void ParallelStrategy::setup_module_states() {
  if (options_.sync_module_states) sync_module_states();
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
  // Reduced on a CPU copy and moved back as a new tensor: a lazy tensor
  // updated in place (all_reduce's copy_) gives wrong detached views in
  // libtorch 1.13 (see AllGatherFn).
  at::Tensor out = tensor.detach().to(torch::kCPU).clone();
  collectives_->all_reduce(out, op);
  return out.to(tensor.device());
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
  visit_tensors(value, [&](const at::Tensor& t) {
    on_device.push_back(t.device().is_cpu() ? 0 : 1);
    return t;
  });
  c10::IValue out = collectives_->broadcast_object(c10::ivalue::Tuple::create({to_cpu(value), on_device}), src);
  if (global_rank() == src) return value;
  const auto& parts = out.toTupleRef().elements();
  const c10::List<int64_t> flags = parts.at(1).toIntList();
  const c10::Device dev = root_device();
  size_t i = 0;
  return visit_tensors(parts.at(0), [&](const at::Tensor& t) {
    if (i >= flags.size()) throw CollectiveError("broadcast: rank " + std::to_string(src) + " sent more tensors than flags");
    return flags.get(i++) ? t.to(dev) : t;
  });
}

bool ParallelStrategy::reduce_boolean_decision(bool decision, bool all) {
  if (!collectives_ || world_size() == 1) return decision;
  at::Tensor t = torch::tensor(decision ? 1 : 0, torch::kInt32);
  collectives_->all_reduce_async(t, ReduceOp::kSum)->wait();
  const int64_t n = t.item<int64_t>();
  return all ? n == world_size() : n > 0;
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
  return sampler && sampler->options().num_replicas == world;
}

}  // namespace

std::shared_ptr<BatchSource> ParallelStrategy::process_dataloader(std::shared_ptr<BatchSource> loader) {
  if (world_size() == 1 || !options_.use_distributed_sampler || sharded_for(*loader, world_size())) return loader;
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
  DistributedSampler::Options so;
  so.num_replicas = world_size();
  so.rank = global_rank();
  so.shuffle = dl->options().shuffle();
  so.seed = dl->options().seed();
  so.drop_last = false;  // as Lightning: the sampler pads; the loader's drop_last applies to batches
  return dl->with_sampler(std::make_shared<DistributedSampler>(dl->dataset()->size(), so));
}

// --- DDPStrategy ----------------------------------------------------------

DDPStrategy::DDPStrategy(std::shared_ptr<Accelerator> accelerator, std::vector<int64_t> parallel_devices,
                         std::shared_ptr<CheckpointIO> checkpoint_io, std::shared_ptr<Precision> precision,
                         ParallelOptions options)
    : ParallelStrategy(std::move(accelerator), std::move(parallel_devices), std::move(checkpoint_io),
                       std::move(precision), std::move(options)) {}

DDPStrategy::~DDPStrategy() = default;

void DDPStrategy::setup(Trainer& trainer) {
  Strategy::setup(trainer);
  gradient_sync_.reset();
  // One process: its gradients are already the mean.
  if (trainer.impl().stage == Stage::kFit && collectives_ && world_size() > 1) gradient_sync_ = make_gradient_sync();
}

std::unique_ptr<detail::GradientSync> DDPStrategy::make_gradient_sync() {
  return detail::make_bucket_reducer(detail::unique_trainable_parameters(*model_), collectives_);
}

void DDPStrategy::sync_gradients() {
  if (gradient_sync_) gradient_sync_->finalize();
}

void DDPStrategy::set_gradient_sync(bool enabled) {
  if (gradient_sync_) gradient_sync_->set_enabled(enabled);
}

double DDPStrategy::gradient_sync_seconds() const { return gradient_sync_ ? gradient_sync_->seconds() : 0.0; }

void DDPStrategy::teardown() {
  gradient_sync_.reset();
  ParallelStrategy::teardown();
}

// --- XLAStrategy ----------------------------------------------------------

XLAStrategy::XLAStrategy(std::vector<int64_t> parallel_devices, std::shared_ptr<CheckpointIO> checkpoint_io,
                         std::shared_ptr<Precision> precision, ParallelOptions options)
    : DDPStrategy(std::make_shared<XLAAccelerator>(), std::move(parallel_devices),
                  detail::xla_checkpoint_io(std::move(checkpoint_io), "XLAStrategy"),
                  detail::xla_precision(std::move(precision), "XLAStrategy"), std::move(options)) {}

c10::Device XLAStrategy::root_device() const {
  if (!launched_) throw std::runtime_error("Accessing the XLA device before processes have spawned is not allowed.");
  return accelerator_->device(local_rank());
}

void XLAStrategy::mark_step() { xla::mark_step(); }

std::unique_ptr<detail::GradientSync> XLAStrategy::make_gradient_sync() {
  // Strategy::optimizer_step marks the step (materializing the gradients) before syncing.
  return detail::make_step_reducer(detail::unique_trainable_parameters(*model_), collectives_, nullptr);
}

std::shared_ptr<BatchSource> XLAStrategy::process_dataloader(std::shared_ptr<BatchSource> loader) {
  // A DeviceLoader that process_dataloader made comes back unchanged from both steps.
  return detail::xla_device_loader(ParallelStrategy::process_dataloader(std::move(loader)), root_device());
}

void XLAStrategy::save_checkpoint(const Checkpoint& checkpoint, const std::string& path,
                                  const StorageOptions& storage_options) {
  mark_step();
  ParallelStrategy::save_checkpoint(checkpoint, path, storage_options);
}

void XLAStrategy::teardown() {
  if (launched_) mark_step();
  if (options_.debug && is_global_zero()) std::cerr << xla::metrics_report() << std::endl;
  DDPStrategy::teardown();
}

}  // namespace fulgur
