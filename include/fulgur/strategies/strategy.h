// SPDX-License-Identifier: Apache-2.0
#pragma once
// Strategy: how a model is run on its devices. A Strategy holds
//  - an Accelerator: the one given, or a CPUAccelerator made by the constructor;
//  - a CheckpointIO and a Precision: the ones given, or TorchCheckpointIO and
//    Precision("32-true") made on first use (the xla strategies make
//    XLACheckpointIO and XLAPrecision in their constructors and refuse others);
//  - the module it runs (connect), and from setup on the optimizers and
//    schedulers its configure_optimizers returned (optimizer_config).
// SingleDeviceStrategy (single_device.h) and SingleDeviceXLAStrategy
// (single_xla.h) run in the calling process. ParallelStrategy (parallel.h)
// also holds a ClusterEnvironment (given in its ParallelOptions, or detected
// once by its constructor), its Launcher, made by the constructor from what
// that environment says, and in each worker, from setup_environment to
// teardown, the process group (collectives), formed where the environment's
// rendezvous() says; DDPStrategy (ddp.h) and XLAStrategy (xla.h) derive from it.

#include <fulgur/checkpoint.h>
#include <fulgur/optimizer_config.h>
#include <fulgur/plugins/io/checkpoint_io.h>
#include <fulgur/types.h>

#include <c10/core/Device.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace fulgur {

class Accelerator;
class BatchSource;
class Launcher;
class LightningModule;
class Precision;
class Trainer;
namespace detail {
struct TrainerImpl;
}

// How Strategy::reduce_boolean_decision combines the ranks' decisions.
enum class DecisionRule { kAll, kAny };

class Strategy {
 public:
  Strategy(std::shared_ptr<Accelerator> accelerator, std::shared_ptr<CheckpointIO> checkpoint_io,
           std::shared_ptr<Precision> precision);
  virtual ~Strategy();

  // --- Parts --------------------------------------------------------------
  Accelerator& accelerator() const;
  virtual CheckpointIO& checkpoint_io();
  virtual Precision& precision();
  // nullptr when this strategy runs in the calling process.
  virtual Launcher* launcher() { return nullptr; }

  // --- Ranks (0 / 1 before launch) ------------------------------------------
  virtual int64_t global_rank() const { return 0; }
  virtual int64_t local_rank() const { return 0; }
  virtual int64_t node_rank() const { return 0; }
  virtual int64_t world_size() const { return 1; }
  bool is_global_zero() const { return global_rank() == 0; }
  // The device this process trains on. Throws before it is known.
  virtual c10::Device root_device() const = 0;

  // --- Lifecycle -------------------------------------------------------------
  // Keeps the module this strategy runs.
  virtual void connect(LightningModule& model);
  LightningModule* model() const { return model_; }
  // In the worker, before setup: device backend and process group.
  virtual void setup_environment();
  // Precision conversion, model_to_device, then (when fitting) the optimizers (setup_optimizers).
  virtual void setup(Trainer& trainer);
  // Parameters and buffers onto root_device(); tied weights stay tied.
  virtual void model_to_device();
  // After the module is on its device: make replicas agree (parallel strategies).
  virtual void setup_module_states() {}
  // Releases process group, device state; moves the module back to the CPU.
  virtual void teardown();
  const OptimizerConfig& optimizer_config() const { return optimizer_config_; }

  // --- Steps -------------------------------------------------------------------
  virtual void on_train_batch_start(const Batch& batch, int64_t batch_idx);
  // When fit's loop has ended (after the module's and the callbacks' on_fit_end), on every rank.
  virtual void on_train_end() {}
  // Each step: the precision's input conversion, in its ForwardContext (CPU
  // autocast for bf16-mixed). The evaluation steps also without gradient recording.
  virtual StepOutput training_step(const Batch& batch, int64_t batch_idx);
  virtual StepOutput validation_step(const Batch& batch, int64_t batch_idx);
  virtual StepOutput test_step(const Batch& batch, int64_t batch_idx);
  virtual at::Tensor predict_step(const Batch& batch, int64_t batch_idx);
  virtual void backward(const at::Tensor& loss);
  // precision().optimizer_step over the connected module: the closure, then
  // sync_gradients() and before_step (the trainer's on_before_optimizer_step
  // and clipping; nullptr under manual optimization), then the update. What a
  // device needs around it is the precision plugin's (XLAPrecision marks
  // steps). Throws std::logic_error when no module is connected.
  virtual void optimizer_step(torch::optim::Optimizer& optimizer, const std::function<void()>& closure,
                              const std::function<void()>& before_step);
  // Whether the next backward's gradients are synced (false while accumulating).
  virtual void set_gradient_sync(bool /*enabled*/) {}
  // Makes every rank's gradients the mean over ranks (no-op on one process).
  virtual void sync_gradients() {}

  // --- Collectives (identity on one process) -------------------------------------
  // reduce_op: "mean"/"avg" (default), "sum", "max", "min".
  virtual at::Tensor reduce(const at::Tensor& tensor, const std::string& reduce_op = "mean");
  // A tensor `value` is reduced as above; any other value (a number, a string, a dict, even one
  // holding tensors) is returned unchanged.
  c10::IValue reduce(const c10::IValue& value, const std::string& reduce_op = "mean");
  // [world_size, *tensor.shape] on several processes; on one (and before the workers exist)
  // `tensor` itself, as Lightning's. With sync_grads the result is differentiable.
  virtual at::Tensor all_gather(const at::Tensor& tensor, bool sync_grads = false);
  // Rank src's value on every rank (tensors, numbers, strings, dicts, lists,
  // tuples, nested). A tensor that was on the CPU on src is a CPU tensor on
  // every rank; one on src's device is on each rank's root_device().
  virtual c10::IValue broadcast(const c10::IValue& value, int64_t src = 0);
  virtual void barrier(const std::string& name = "");
  // The same answer on every rank: whether `decision` is true on all ranks
  // (DecisionRule::kAll) or on at least one (kAny). Every rank must call.
  bool reduce_boolean_decision(bool decision, DecisionRule rule = DecisionRule::kAll);

  // --- Data --------------------------------------------------------------------------
  // The loader the loops read: `loader` itself on the CPU; on a CUDA root
  // device a DeviceLoader over it, which copies each batch to the device from
  // pinned memory without blocking, while the current step runs.
  virtual std::shared_ptr<BatchSource> process_dataloader(std::shared_ptr<BatchSource> loader);

  // --- Checkpoints ---------------------------------------------------------------------
  // Rank 0 writes; every rank must call.
  virtual void save_checkpoint(const Checkpoint& checkpoint, const std::string& path,
                               const StorageOptions& storage_options = {});
  virtual Checkpoint load_checkpoint(const std::string& path);
  virtual void remove_checkpoint(const std::string& path);

 protected:
  // The module's configure_optimizers, checked, with any optimizer state on the parameters'
  // device (Lightning's setup_optimizers). setup calls it when fitting, and the Trainer again
  // after LearningRateFinder's test (which keeps its count of scheduler steps in step with the
  // new schedulers, hence not public). REQUIRES: the module is on its device.
  void setup_optimizers();
  friend struct detail::TrainerImpl;

  // How many ranks hold a true `decision` (reduce_boolean_decision's count).
  virtual int64_t count_true(bool decision);

  std::shared_ptr<Accelerator> accelerator_;
  std::shared_ptr<CheckpointIO> checkpoint_io_;
  std::shared_ptr<Precision> precision_;
  LightningModule* model_ = nullptr;
  OptimizerConfig optimizer_config_;
};

}  // namespace fulgur
