// SPDX-License-Identifier: Apache-2.0
#include <fulgur/accelerators/accelerator.h>
#include <fulgur/data/device_loader.h>
#include <fulgur/lightning_module.h>
#include <fulgur/lr_scheduler.h>
#include <fulgur/plugins/precision/precision.h>
#include <fulgur/strategies/strategy.h>
#include <fulgur/trainer.h>

#include <fulgur/distributed/collectives.h>
#include "optim/optim_state.h"
#include "trainer/run_context.h"
#include <fulgur/module_mover.h>

#include <torch/torch.h>

#include <stdexcept>

namespace fulgur {

Strategy::Strategy(std::shared_ptr<Accelerator> accelerator, std::shared_ptr<CheckpointIO> checkpoint_io,
                   std::shared_ptr<Precision> precision)
    : accelerator_(std::move(accelerator)), checkpoint_io_(std::move(checkpoint_io)), precision_(std::move(precision)) {
  if (!accelerator_) accelerator_ = std::make_shared<CPUAccelerator>();
}

Strategy::~Strategy() = default;

Accelerator& Strategy::accelerator() const { return *accelerator_; }

CheckpointIO& Strategy::checkpoint_io() {
  if (!checkpoint_io_) checkpoint_io_ = std::make_shared<TorchCheckpointIO>();
  return *checkpoint_io_;
}

Precision& Strategy::precision() {
  if (!precision_) precision_ = std::make_shared<Precision>();
  return *precision_;
}

void Strategy::connect(LightningModule& model) { model_ = &model; }

void Strategy::setup_environment() { accelerator_->setup_device(root_device()); }

void Strategy::setup(Trainer& trainer) {
  if (!model_) throw std::logic_error("Strategy::setup: no module connected");
  check_precision_device(precision(), root_device());
  precision().convert_module(*model_);
  model_to_device();
  setup_module_states();
  optimizer_config_ = OptimizerConfig();
  if (detail::run_context(trainer).stage() == Stage::kFit) setup_optimizers();
}

void Strategy::setup_optimizers() {
  if (!model_) throw std::logic_error("Strategy::setup_optimizers: no module connected");
  optimizer_config_ = model_->configure_optimizers();
  if (optimizer_config_.optimizers.empty()) {
    throw std::invalid_argument(model_->name() + "::configure_optimizers returned no optimizer");
  }
  if (model_->automatic_optimization() && optimizer_config_.optimizers.size() > 1) {
    throw std::invalid_argument(model_->name() + "::configure_optimizers returned " +
                                std::to_string(optimizer_config_.optimizers.size()) +
                                " optimizers; automatic optimization drives one. Use manual optimization for several");
  }
  for (const auto& s : optimizer_config_.schedulers) {
    if (!s.scheduler()) throw std::invalid_argument("configure_optimizers: a SchedulerConfig has no scheduler");
    if (s.interval() != "step" && s.interval() != "epoch") {
      throw std::invalid_argument("configure_optimizers: scheduler interval '" + s.interval() +
                                  "' is not known; valid: \"step\", \"epoch\"");
    }
    if (dynamic_cast<lr_scheduler::ReduceLROnPlateau*>(s.scheduler().get()) && s.monitor().empty()) {
      throw std::invalid_argument("configure_optimizers: a ReduceLROnPlateau scheduler needs the metric it follows: "
                                  "SchedulerConfig(...).monitor(\"val_loss\") (a name your module logs), as in Lightning");
    }
  }
  for (auto& o : optimizer_config_.optimizers) detail::optimizer_state_to_params_device(*o);
}

void Strategy::model_to_device() {
  if (model_) move_module(*model_, root_device());
}

void Strategy::teardown() {
  if (model_) move_module(*model_, c10::Device(c10::kCPU));
  accelerator_->teardown();
}

void Strategy::on_train_batch_start(const Batch&, int64_t) {}

StepOutput Strategy::training_step(const Batch& batch, int64_t batch_idx) {
  ForwardContext context(precision());
  return model_->training_step(precision().convert_input(batch), batch_idx);
}

StepOutput Strategy::validation_step(const Batch& batch, int64_t batch_idx) {
  torch::NoGradGuard no_grad;
  ForwardContext context(precision());
  return model_->validation_step(precision().convert_input(batch), batch_idx);
}

StepOutput Strategy::test_step(const Batch& batch, int64_t batch_idx) {
  torch::NoGradGuard no_grad;
  ForwardContext context(precision());
  return model_->test_step(precision().convert_input(batch), batch_idx);
}

at::Tensor Strategy::predict_step(const Batch& batch, int64_t batch_idx) {
  torch::NoGradGuard no_grad;
  ForwardContext context(precision());
  return model_->predict_step(precision().convert_input(batch), batch_idx);
}

void Strategy::backward(const at::Tensor& loss) {
  try {
    precision().pre_backward(loss).backward();
  } catch (const c10::Error& e) {
    const std::string what = e.what_without_backtrace();
    if (what.find("fork-based multiprocessing") == std::string::npos) throw;
    // With a CUDA libtorch on a machine with a GPU, the first backward of a process starts the
    // autograd engine's device threads, and libtorch refuses backward in a process forked after that.
    throw std::runtime_error(
        "backward failed in a forked worker: the launching process had already run a backward (a fit, or "
        "autograd of its own) with a CUDA libtorch, whose autograd threads do not survive fork. Start the "
        "workers with TrainerOptions().start_method(\"spawn\") (ParallelOptions::start_method for a strategy "
        "object), or run no backward in the launching process before fit. libtorch said: " +
        what.substr(0, what.find('\n')));
  }
}

void Strategy::optimizer_step(torch::optim::Optimizer& optimizer, const std::function<void()>& closure,
                              const std::function<void()>& before_step) {
  if (!model_) throw std::logic_error("Strategy::optimizer_step: no module connected");
  precision().optimizer_step(optimizer, *model_, closure, [&] {
    sync_gradients();
    // After the sync, so that every rank sees the same gradients and skips the same steps.
    precision().unscale_gradients(optimizer);
    if (before_step) before_step();
  });
}

at::Tensor Strategy::reduce(const at::Tensor& tensor, const std::string& reduce_op) {
  const ReduceOp op = parse_reduce_op(reduce_op);
  if (op == ReduceOp::kMean && !tensor.is_floating_point()) return tensor.to(torch::kFloat64);
  return tensor;
}

c10::IValue Strategy::reduce(const c10::IValue& value, const std::string& reduce_op) {
  parse_reduce_op(reduce_op);
  if (value.isTensor()) return reduce(value.toTensor(), reduce_op);
  return value;
}

at::Tensor Strategy::all_gather(const at::Tensor& tensor, bool /*sync_grads*/) { return tensor; }

c10::IValue Strategy::broadcast(const c10::IValue& value, int64_t src) {
  if (src != 0) {
    throw std::invalid_argument("broadcast: src=" + std::to_string(src) + " is outside [0, " +
                                std::to_string(world_size()) + ")");
  }
  return value;
}

void Strategy::barrier(const std::string&) {}

bool Strategy::reduce_boolean_decision(bool decision, DecisionRule rule) {
  if (world_size() == 1) return decision;
  const int64_t n = count_true(decision);
  return rule == DecisionRule::kAll ? n == world_size() : n > 0;
}

int64_t Strategy::count_true(bool decision) {
  return reduce(torch::tensor(decision ? 1 : 0, torch::kInt32), "sum").item<int64_t>();
}

std::shared_ptr<BatchSource> Strategy::process_dataloader(std::shared_ptr<BatchSource> loader) {
  return detail::cuda_device_loader(std::move(loader), root_device());
}

void Strategy::save_checkpoint(const Checkpoint& checkpoint, const std::string& path, const StorageOptions& opts) {
  if (is_global_zero()) checkpoint_io().save_checkpoint(checkpoint, path, opts);
}

Checkpoint Strategy::load_checkpoint(const std::string& path) { return checkpoint_io().load_checkpoint(path); }

void Strategy::remove_checkpoint(const std::string& path) {
  if (local_rank() == 0) checkpoint_io().remove_checkpoint(path);
}

}  // namespace fulgur
