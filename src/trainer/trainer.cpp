// SPDX-License-Identifier: Apache-2.0
// The Trainer's façade: fit / validate / test / predict hand a stage to
// TrainerImpl::run (run.cpp); the accessors read its state.

#include <fulgur/callbacks/model_checkpoint.h>
#include <fulgur/checkpoint.h>
#include <fulgur/data_module.h>
#include <fulgur/launchers/launcher.h>
#include <fulgur/lightning_module.h>
#include <fulgur/loggers/logger.h>
#include <fulgur/strategies/strategy.h>
#include <fulgur/trainer.h>

#include "trainer/trainer_impl.h"

#include <fulgur/accelerators/accelerator.h>
#include <fulgur/xla/random.h>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/optim/optimizer.h>
#include <torch/torch.h>

#include <cstdlib>
#include <stdexcept>

namespace fulgur {

void seed_everything(uint64_t seed) {
  // The CPU generator now; CUDA's when fulgur starts CUDA in this process (CUDAAccelerator), as
  // Python's torch.manual_seed queues CUDA's seeding until CUDA starts. torch::manual_seed would
  // start CUDA here, and the workers forked after that could not use it.
  {
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_current_seed(seed);
  }
  detail::seed_cuda_generators(seed);
  // The xla device generator keys itself with the seed and this process's rank at its next draw.
  xla::manual_seed(seed);
  std::srand(static_cast<unsigned>(seed));
}

Stage detail::TrainerRunContext::stage() const { return impl_.stage; }

void detail::TrainerRunContext::log(const std::string& name, const at::Tensor& value, const LogOptions& options) {
  impl_.logging.log(name, value, options);
}

void detail::TrainerRunContext::optimizer_step(torch::optim::Optimizer& optimizer, const std::function<void()>& closure) {
  impl_.fit_loop.epoch_loop.manual.optimizer_step(optimizer, closure);
}

const std::vector<at::Tensor>& detail::TrainerRunContext::predictions() const { return impl_.predict_loop.predictions(); }

const std::vector<std::vector<int64_t>>& detail::TrainerRunContext::predict_batch_indices() const {
  return impl_.predict_loop.batch_indices();
}

void detail::TrainerRunContext::run_probe(Callback& probe, int64_t max_steps) { impl_.run_probe(probe, max_steps); }

void detail::TrainerRunContext::reconfigure_optimizers() { impl_.reconfigure_optimizers(); }

// --- Trainer ---------------------------------------------------------------

detail::RunContext& detail::run_context(const Trainer& trainer) { return trainer.impl_->context; }

Trainer::Trainer(TrainerOptions options) : impl_(std::make_unique<detail::TrainerImpl>(*this, std::move(options))) {}
Trainer::~Trainer() = default;

void Trainer::fit(LightningModule& model, DataModule& datamodule, const std::string& ckpt_path) {
  impl_->run(Stage::kFit, model, detail::StageData::from(datamodule), ckpt_path);
}

void Trainer::fit(LightningModule& model, std::shared_ptr<BatchSource> train_loader,
                  std::shared_ptr<BatchSource> val_loader, const std::string& ckpt_path) {
  impl_->run(Stage::kFit, model, detail::StageData::from(Stage::kFit, std::move(train_loader), std::move(val_loader)),
             ckpt_path);
}

Metrics Trainer::validate(LightningModule& model, DataModule& datamodule, const std::string& ckpt_path) {
  impl_->run(Stage::kValidate, model, detail::StageData::from(datamodule), ckpt_path);
  return callback_metrics();
}

Metrics Trainer::validate(LightningModule& model, std::shared_ptr<BatchSource> loader, const std::string& ckpt_path) {
  impl_->run(Stage::kValidate, model, detail::StageData::from(Stage::kValidate, std::move(loader)), ckpt_path);
  return callback_metrics();
}

Metrics Trainer::test(LightningModule& model, DataModule& datamodule, const std::string& ckpt_path) {
  impl_->run(Stage::kTest, model, detail::StageData::from(datamodule), ckpt_path);
  return callback_metrics();
}

Metrics Trainer::test(LightningModule& model, std::shared_ptr<BatchSource> loader, const std::string& ckpt_path) {
  impl_->run(Stage::kTest, model, detail::StageData::from(Stage::kTest, std::move(loader)), ckpt_path);
  return callback_metrics();
}

std::vector<at::Tensor> Trainer::predict(LightningModule& model, DataModule& datamodule, const std::string& ckpt_path) {
  impl_->run(Stage::kPredict, model, detail::StageData::from(datamodule), ckpt_path);
  return impl_->predict_loop.predictions();
}

std::vector<at::Tensor> Trainer::predict(LightningModule& model, std::shared_ptr<BatchSource> loader,
                                         const std::string& ckpt_path) {
  impl_->run(Stage::kPredict, model, detail::StageData::from(Stage::kPredict, std::move(loader)), ckpt_path);
  return impl_->predict_loop.predictions();
}

const TrainerOptions& Trainer::options() const { return impl_->options; }
Strategy& Trainer::strategy() const { return *impl_->strategy; }
int64_t Trainer::current_epoch() const { return impl_->progress.epoch; }
int64_t Trainer::global_step() const { return impl_->progress.global_step; }
bool Trainer::should_stop() const { return impl_->fit_loop.should_stop(); }
void Trainer::set_should_stop(bool value) { impl_->fit_loop.set_should_stop(value); }
bool Trainer::sanity_checking() const { return impl_->evaluation_loop.sanity_checking(); }
bool Trainer::is_global_zero() const { return impl_->strategy->is_global_zero(); }
int64_t Trainer::world_size() const { return impl_->strategy->world_size(); }
int64_t Trainer::global_rank() const { return impl_->strategy->global_rank(); }
int64_t Trainer::num_training_batches() const { return impl_->fit_loop.num_training_batches(); }
int64_t Trainer::num_val_batches() const { return impl_->fit_loop.num_val_batches(); }
int64_t Trainer::max_epochs() const { return impl_->resolved.max_epochs; }
int64_t Trainer::max_steps() const { return impl_->options.max_steps(); }
int64_t Trainer::accumulate_grad_batches() const {
  return impl_->fit_loop.epoch_loop.automatic.accumulate_grad_batches();
}

void Trainer::set_accumulate_grad_batches(int64_t k) {
  if (k < 1) throw std::invalid_argument("accumulate_grad_batches=" + std::to_string(k) + " must be >= 1");
  impl_->fit_loop.epoch_loop.automatic.set_accumulate_grad_batches(k);
}

const Metrics& Trainer::callback_metrics() const {
  impl_->logging.materialize_metrics();
  return impl_->logging.callback_metrics;
}

const Metrics& Trainer::progress_bar_metrics() const {
  for (const auto& [k, v] : impl_->logging.pending_prog_bar) impl_->logging.progress_bar_metrics[k] = v.item<double>();
  impl_->logging.pending_prog_bar.clear();
  return impl_->logging.progress_bar_metrics;
}

const std::shared_ptr<Logger>& Trainer::logger() const {
  static const std::shared_ptr<Logger> none;
  return impl_->loggers.empty() ? none : impl_->loggers.front();
}

const std::vector<std::shared_ptr<Logger>>& Trainer::loggers() const { return impl_->loggers; }

std::string Trainer::log_dir() const {
  if (!impl_->loggers.empty()) return impl_->loggers.front()->log_dir();
  return impl_->options.default_root_dir();
}

const std::vector<std::shared_ptr<Callback>>& Trainer::callbacks() const { return impl_->callbacks; }

ModelCheckpoint* Trainer::checkpoint_callback() const { return detail::find_callback<ModelCheckpoint>(impl_->callbacks); }

const OptimizerConfig& Trainer::optimizer_config() const { return impl_->strategy->optimizer_config(); }

Checkpoint Trainer::dump_checkpoint() {
  if (impl_->checkpoints.final_checkpoint && !is_fulgur_worker()) {
    // After a multi-process fit, in the launching process: rank 0's state at
    // the end of fit, with the weights of the model as they are now.
    Checkpoint c = impl_->checkpoints.final_checkpoint->copy();
    c.insert_or_assign("state_dict", state_dict(*impl_->model));
    return c;
  }
  return impl_->checkpoints.dump();
}

void Trainer::save_checkpoint(const std::string& path) {
  strategy().save_checkpoint(dump_checkpoint(), path);
  strategy().barrier("Trainer.save_checkpoint");
}

}  // namespace fulgur

