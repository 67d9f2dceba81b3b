// SPDX-License-Identifier: Apache-2.0
#include <fulgur/lightning_module.h>
#include <fulgur/strategies/strategy.h>
#include <fulgur/trainer.h>

#include "trainer/run_context.h"

#include <torch/torch.h>

#include <cstdio>
#include <stdexcept>

namespace fulgur {

OptimizerConfig::OptimizerConfig(std::vector<std::shared_ptr<torch::optim::Optimizer>> opts,
                                 std::vector<SchedulerConfig> scheds)
    : optimizers(std::move(opts)), schedulers(std::move(scheds)) {}

void LightningOptimizer::step(const std::function<void()>& closure) {
  if (!trainer_) throw std::logic_error("LightningOptimizer::step outside a Trainer run");
  detail::run_context(*trainer_).optimizer_step(*optimizer_, closure);
}

LightningModule::LightningModule(std::string name) : torch::nn::Module(std::move(name)) {}
LightningModule::~LightningModule() = default;

StepOutput LightningModule::validation_step(const Batch&, int64_t) { return {}; }
StepOutput LightningModule::test_step(const Batch&, int64_t) { return {}; }

at::Tensor LightningModule::predict_step(const Batch&, int64_t) {
  throw std::logic_error(name() + " does not override predict_step; override it to use Trainer::predict");
}

void LightningModule::log(const std::string& name, const at::Tensor& value, LogOptions options) {
  if (!trainer_) throw std::logic_error("log('" + name + "') was called outside a Trainer run");
  detail::run_context(*trainer_).log(name, value, options);
}

void LightningModule::log(const std::string& name, double value, LogOptions options) {
  log(name, torch::tensor(value, torch::kFloat64), std::move(options));
}

void LightningModule::log_dict(const std::map<std::string, at::Tensor>& values, const LogOptions& options) {
  for (const auto& [name, value] : values) log(name, value, options);
}

void LightningModule::log_dict(const std::map<std::string, double>& values, const LogOptions& options) {
  for (const auto& [name, value] : values) log(name, value, options);
}

void LightningModule::log_dict(const std::map<std::string, at::Tensor>& values, const LogOptions& options,
                               const std::string& prefix) {
  for (const auto& [name, value] : values) log(prefix + name, value, options);
}

void LightningModule::log_dict(const std::map<std::string, double>& values, const LogOptions& options,
                               const std::string& prefix) {
  for (const auto& [name, value] : values) log(prefix + name, value, options);
}

void LightningModule::print(const std::string& text) const {
  if (global_rank() != 0) return;
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

at::Tensor LightningModule::all_gather(const at::Tensor& tensor, bool sync_grads) {
  if (!trainer_) return tensor;
  return trainer_->strategy().all_gather(tensor, sync_grads);
}

std::vector<LightningOptimizer> LightningModule::optimizers() {
  if (!trainer_) throw std::logic_error("optimizers() is only available while a Trainer runs");
  std::vector<LightningOptimizer> out;
  for (const auto& o : trainer_->optimizer_config().optimizers) out.emplace_back(trainer_, o);
  return out;
}

void LightningModule::manual_backward(const at::Tensor& loss) {
  if (!trainer_) throw std::logic_error("manual_backward() is only available while a Trainer runs");
  trainer_->strategy().backward(loss);
}

int64_t LightningModule::current_epoch() const { return trainer_ ? trainer_->current_epoch() : 0; }
int64_t LightningModule::global_step() const { return trainer_ ? trainer_->global_step() : 0; }
int64_t LightningModule::global_rank() const { return trainer_ ? trainer_->strategy().global_rank() : 0; }
int64_t LightningModule::local_rank() const { return trainer_ ? trainer_->strategy().local_rank() : 0; }
int64_t LightningModule::world_size() const { return trainer_ ? trainer_->strategy().world_size() : 1; }

c10::Device LightningModule::device() const {
  auto params = parameters(true);
  if (!params.empty()) return params.front().device();
  return c10::Device(c10::kCPU);
}

}  // namespace fulgur
