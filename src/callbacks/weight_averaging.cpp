// SPDX-License-Identifier: Apache-2.0
#include <fulgur/callbacks/weight_averaging.h>
#include <fulgur/checkpoint.h>
#include <fulgur/lightning_module.h>
#include <fulgur/trainer.h>

#include "runtime/log.h"

#include <torch/torch.h>

#include <stdexcept>

namespace fulgur {
namespace {

// The module's parameters then buffers, by dotted name: the order the averaged copy keeps.
std::vector<std::pair<std::string, at::Tensor>> named_tensors(LightningModule& module) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (auto& p : module.named_parameters(true)) out.emplace_back(p.key(), p.value());
  for (auto& b : module.named_buffers(true)) out.emplace_back(b.key(), b.value());
  return out;
}

c10::Dict<std::string, c10::IValue> as_dict(const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  auto d = make_dict();
  for (const auto& [name, t] : tensors) d.insert(name, t.detach().to(torch::kCPU).clone());
  return d;
}

c10::Dict<std::string, c10::IValue> dict_at(const Checkpoint& ckpt, const char* key) {
  const c10::IValue v = ckpt.at(key);
  if (!v.isGenericDict()) throw std::runtime_error(std::string("WeightAveraging: checkpoint['") + key + "'] is not a dict");
  return c10::impl::toTypedDict<std::string, c10::IValue>(v.toGenericDict());
}

}  // namespace

AveragingFn ema_avg_fn(double decay) {
  if (!(decay >= 0.0 && decay <= 1.0)) {
    throw std::invalid_argument("ema_avg_fn: decay=" + std::to_string(decay) + " is outside [0, 1]");
  }
  return [decay](const at::Tensor& averaged, const at::Tensor& current, int64_t) {
    return averaged * decay + current * (1.0 - decay);
  };
}

WeightAveraging::WeightAveraging(WeightAveragingOptions options) : options_(std::move(options)) {}

bool WeightAveraging::should_update(std::optional<int64_t> step_idx, std::optional<int64_t>) const {
  return step_idx.has_value();
}

void WeightAveraging::setup(Trainer&, LightningModule& module, Stage stage) {
  // Validation outside fit runs on the module's weights (after fit: the averaged ones), not on
  // a copy left by an earlier fit, which a checkpoint loaded since would contradict.
  fitting_ = stage == Stage::kFit;
  if (!fitting_) return;
  // A fresh copy for each fit, as Lightning's AveragedModel made in setup("fit").
  torch::NoGradGuard no_grad;
  averaged_.clear();
  for (auto& [name, t] : named_tensors(module)) {
    averaged_.emplace_back(name, t.detach().to(options_.device().value_or(t.device())).clone());
  }
  num_averaged_ = 0;
}

void WeightAveraging::update(LightningModule& module) {
  torch::NoGradGuard no_grad;
  const auto current = named_tensors(module);
  if (current.size() != averaged_.size()) {
    throw std::logic_error("WeightAveraging: the module has " + std::to_string(current.size()) +
                           " parameters and buffers, the averaged copy " + std::to_string(averaged_.size()) +
                           "; the module changed its layers after setup");
  }
  const int64_t n_params = static_cast<int64_t>(module.parameters(true).size());
  for (size_t i = 0; i < averaged_.size(); ++i) {
    at::Tensor& avg = averaged_[i].second;
    const at::Tensor cur = current[i].second.detach().to(avg.device());
    const bool is_buffer = static_cast<int64_t>(i) >= n_params;
    const bool average = avg.is_floating_point() && (!is_buffer || options_.use_buffers());
    if (num_averaged_ == 0 || !average) {
      avg.copy_(cur);
    } else if (options_.avg_fn()) {
      avg.copy_(options_.avg_fn()(avg, cur, num_averaged_));
    } else {
      avg.add_((cur - avg) / static_cast<double>(num_averaged_ + 1));
    }
  }
  ++num_averaged_;
}

void WeightAveraging::swap(LightningModule& module) {
  torch::NoGradGuard no_grad;
  auto current = named_tensors(module);
  for (size_t i = 0; i < averaged_.size() && i < current.size(); ++i) {
    at::Tensor& avg = averaged_[i].second;
    at::Tensor& cur = current[i].second;
    const at::Tensor held = avg.clone();
    avg.copy_(cur.detach());
    cur.copy_(held.to(cur.device()));
  }
}

void WeightAveraging::on_train_batch_end(Trainer& trainer, LightningModule& module, const StepOutput&, const Batch&,
                                         int64_t) {
  // global_step counts optimizer steps: after a batch that only accumulated, it has not moved.
  if (trainer.global_step() > latest_update_step_ && should_update(trainer.global_step() - 1, std::nullopt)) {
    update(module);
    latest_update_step_ = trainer.global_step();
  }
}

void WeightAveraging::on_train_epoch_end(Trainer& trainer, LightningModule& module) {
  if (trainer.current_epoch() > latest_update_epoch_ && should_update(std::nullopt, trainer.current_epoch())) {
    update(module);
    latest_update_epoch_ = trainer.current_epoch();
  }
}

void WeightAveraging::on_train_end(Trainer&, LightningModule& module) {
  torch::NoGradGuard no_grad;
  auto current = named_tensors(module);
  for (size_t i = 0; i < averaged_.size() && i < current.size(); ++i) {
    current[i].second.copy_(averaged_[i].second.to(current[i].second.device()));
  }
}

void WeightAveraging::on_validation_epoch_start(Trainer&, LightningModule& module) {
  if (fitting_) swap(module);
}

void WeightAveraging::on_validation_epoch_end(Trainer&, LightningModule& module) {
  if (fitting_) swap(module);
}

void WeightAveraging::on_save_checkpoint(Trainer&, LightningModule&, Checkpoint& checkpoint) {
  // Outside fit (no copy) the checkpoint keeps the module's weights, which after fit are the averaged ones.
  if (averaged_.empty()) return;
  checkpoint.insert_or_assign("current_model_state", checkpoint.at("state_dict"));
  checkpoint.insert_or_assign("state_dict", as_dict(averaged_));
  auto state = make_dict();
  state.insert("n_averaged", torch::tensor(num_averaged_, torch::kInt64));
  checkpoint.insert_or_assign("averaging_state", state);
}

void WeightAveraging::on_load_checkpoint(Trainer&, LightningModule& module, const Checkpoint& checkpoint) {
  if (!fitting_) return;
  torch::NoGradGuard no_grad;
  const auto averaged_state = dict_at(checkpoint, "state_dict");
  for (auto& [name, t] : averaged_) {
    if (!averaged_state.contains(name) || !averaged_state.at(name).isTensor()) {
      throw std::runtime_error("WeightAveraging: the checkpoint's state_dict has no tensor '" + name + "'");
    }
    t.copy_(averaged_state.at(name).toTensor().to(t.device(), t.scalar_type()));
  }
  if (checkpoint.contains("current_model_state") && checkpoint.contains("averaging_state")) {
    // The module was loaded from "state_dict", which holds the average: its own weights are these.
    fulgur::load_state_dict(module, dict_at(checkpoint, "current_model_state"), true,
                            "checkpoint['current_model_state']");
    const auto state = dict_at(checkpoint, "averaging_state");
    if (!state.contains("n_averaged") || !state.at("n_averaged").isTensor()) {
      throw std::runtime_error("WeightAveraging: checkpoint['averaging_state'] has no tensor 'n_averaged'");
    }
    num_averaged_ = state.at("n_averaged").toTensor().item<int64_t>();
  } else {
    // Written without WeightAveraging: both copies start from its weights, and the next update
    // copies the module's (no update counted yet), as Lightning's.
    runtime::warn_rank_zero_once(
        "WeightAveraging: the checkpoint was not written with WeightAveraging; the module and the average both "
        "start from its state_dict");
    num_averaged_ = 0;
  }
}

c10::IValue WeightAveraging::state_dict() const {
  auto d = make_dict();
  d.insert("latest_update_step", latest_update_step_);
  d.insert("latest_update_epoch", latest_update_epoch_);  // fulgur's; Lightning's loader reads the keys it knows
  return d;
}

void WeightAveraging::load_state_dict(const c10::IValue& state) {
  if (!state.isGenericDict()) return;
  const auto d = c10::impl::toTypedDict<std::string, c10::IValue>(state.toGenericDict());
  if (d.contains("latest_update_step")) latest_update_step_ = d.at("latest_update_step").toInt();
  if (d.contains("latest_update_epoch")) latest_update_epoch_ = d.at("latest_update_epoch").toInt();
}

EMAWeightAveraging::EMAWeightAveraging(EMAWeightAveragingOptions options)
    : WeightAveraging(WeightAveragingOptions()
                          .avg_fn(ema_avg_fn(options.decay()))
                          .use_buffers(options.use_buffers())
                          .device(options.device())),
      ema_options_(std::move(options)) {
  if (ema_options_.update_every_n_steps() < 1) {
    throw std::invalid_argument("EMAWeightAveraging: update_every_n_steps=" +
                                std::to_string(ema_options_.update_every_n_steps()) + " must be >= 1");
  }
  if (ema_options_.update_starting_at_step().value_or(0) < 0) {
    throw std::invalid_argument("EMAWeightAveraging: update_starting_at_step=" +
                                std::to_string(*ema_options_.update_starting_at_step()) +
                                " must be >= 0 (a step index), or unset");
  }
  if (ema_options_.update_starting_at_epoch().value_or(0) < 0) {
    throw std::invalid_argument("EMAWeightAveraging: update_starting_at_epoch=" +
                                std::to_string(*ema_options_.update_starting_at_epoch()) +
                                " must be >= 0 (an epoch index), or unset");
  }
}

bool EMAWeightAveraging::should_update(std::optional<int64_t> step_idx, std::optional<int64_t> epoch_idx) const {
  if (step_idx && *step_idx >= ema_options_.update_starting_at_step().value_or(0) &&
      *step_idx % ema_options_.update_every_n_steps() == 0) {
    return true;
  }
  return epoch_idx && ema_options_.update_starting_at_epoch() && *epoch_idx >= *ema_options_.update_starting_at_epoch();
}

}  // namespace fulgur
