// SPDX-License-Identifier: Apache-2.0
#include <fulgur/lr_scheduler.h>

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <stdexcept>

namespace fulgur::lr_scheduler {
namespace {

std::string num(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

void require(bool ok, const std::string& message) {
  if (!ok) throw std::invalid_argument(message);
}

std::vector<double> scaled(const std::vector<double>& base, double factor) {
  std::vector<double> out;
  out.reserve(base.size());
  for (double b : base) out.push_back(b * factor);
  return out;
}

}  // namespace

Schedule::Schedule(torch::optim::Optimizer& optimizer) : torch::optim::LRScheduler(optimizer), optimizer_(optimizer) {
  for (const auto& group : optimizer.param_groups()) base_lrs_.push_back(group.options().get_lr());
}

void Schedule::initial_step() {
  const std::vector<double> lrs = lrs_at(0);
  auto& groups = optimizer_.param_groups();
  for (size_t i = 0; i < groups.size() && i < lrs.size(); ++i) groups[i].options().set_lr(lrs[i]);
}

std::vector<double> Schedule::get_lrs() { return lrs_at(static_cast<int64_t>(step_count_) + 1); }

StepLR::StepLR(torch::optim::Optimizer& optimizer, int64_t step_size, double gamma)
    : Schedule(optimizer), step_size_(step_size), gamma_(gamma) {
  require(step_size >= 1, "StepLR: step_size=" + std::to_string(step_size) + " must be >= 1");
  initial_step();
}

std::vector<double> StepLR::lrs_at(int64_t epoch) const {
  return scaled(base_lrs_, std::pow(gamma_, static_cast<double>(epoch / step_size_)));
}

MultiStepLR::MultiStepLR(torch::optim::Optimizer& optimizer, std::vector<int64_t> milestones, double gamma)
    : Schedule(optimizer), milestones_(std::move(milestones)), gamma_(gamma) {
  for (int64_t m : milestones_) require(m >= 0, "MultiStepLR: milestone " + std::to_string(m) + " must be >= 0");
  std::sort(milestones_.begin(), milestones_.end());
  initial_step();
}

std::vector<double> MultiStepLR::lrs_at(int64_t epoch) const {
  // Python's closed form: gamma ** bisect_right(sorted(milestones), epoch); a repeated milestone counts twice.
  const auto passed = std::upper_bound(milestones_.begin(), milestones_.end(), epoch) - milestones_.begin();
  return scaled(base_lrs_, std::pow(gamma_, static_cast<double>(passed)));
}

ExponentialLR::ExponentialLR(torch::optim::Optimizer& optimizer, double gamma) : Schedule(optimizer), gamma_(gamma) {
  initial_step();
}

std::vector<double> ExponentialLR::lrs_at(int64_t epoch) const {
  return scaled(base_lrs_, std::pow(gamma_, static_cast<double>(epoch)));
}

CosineAnnealingLR::CosineAnnealingLR(torch::optim::Optimizer& optimizer, int64_t T_max, double eta_min)
    : Schedule(optimizer), t_max_(T_max), eta_min_(eta_min) {
  require(T_max >= 1, "CosineAnnealingLR: T_max=" + std::to_string(T_max) + " must be >= 1");
  initial_step();
}

std::vector<double> CosineAnnealingLR::lrs_at(int64_t epoch) const {
  const double c = (1.0 + std::cos(M_PI * static_cast<double>(epoch) / static_cast<double>(t_max_))) / 2.0;
  std::vector<double> out;
  for (double b : base_lrs_) out.push_back(eta_min_ + (b - eta_min_) * c);
  return out;
}

LinearLR::LinearLR(torch::optim::Optimizer& optimizer, double start_factor, double end_factor, int64_t total_iters)
    : Schedule(optimizer), start_factor_(start_factor), end_factor_(end_factor), total_iters_(total_iters) {
  require(start_factor > 0 && start_factor <= 1,
          "LinearLR: start_factor=" + num(start_factor) + " must be > 0 and <= 1 (as in PyTorch)");
  require(end_factor >= 0 && end_factor <= 1, "LinearLR: end_factor=" + num(end_factor) + " must be in [0, 1]");
  require(total_iters >= 1, "LinearLR: total_iters=" + std::to_string(total_iters) + " must be >= 1");
  initial_step();
}

std::vector<double> LinearLR::lrs_at(int64_t epoch) const {
  const double done = static_cast<double>(std::min(epoch, total_iters_)) / static_cast<double>(total_iters_);
  return scaled(base_lrs_, start_factor_ + (end_factor_ - start_factor_) * done);
}

LambdaLR::LambdaLR(torch::optim::Optimizer& optimizer, std::function<double(int64_t)> lr_lambda)
    : Schedule(optimizer), lambda_(std::move(lr_lambda)) {
  require(static_cast<bool>(lambda_), "LambdaLR: lr_lambda is empty");
  initial_step();
}

std::vector<double> LambdaLR::lrs_at(int64_t epoch) const { return scaled(base_lrs_, lambda_(epoch)); }

OneCycleLR::OneCycleLR(torch::optim::Optimizer& optimizer, double max_lr, int64_t total_steps, OneCycleOptions options)
    : Schedule(optimizer), max_lr_(max_lr), total_steps_(total_steps), options_(std::move(options)) {
  const OneCycleOptions& o = options_;
  require(total_steps >= 1, "OneCycleLR: total_steps=" + std::to_string(total_steps) + " must be >= 1");
  require(o.pct_start() >= 0 && o.pct_start() <= 1, "OneCycleLR: pct_start=" + num(o.pct_start()) + " must be in [0, 1]");
  require(o.anneal_strategy() == "cos" || o.anneal_strategy() == "linear",
          "OneCycleLR: anneal_strategy='" + o.anneal_strategy() + "' is not known; valid: \"cos\", \"linear\"");
  require(max_lr > 0, "OneCycleLR: max_lr=" + num(max_lr) + " must be > 0");
  require(o.div_factor() > 0 && o.final_div_factor() > 0, "OneCycleLR: div_factor and final_div_factor must be > 0");
  const double total = static_cast<double>(total_steps);
  const double initial = 1.0 / o.div_factor(), min = initial / o.final_div_factor();
  const double lo = o.base_momentum(), hi = o.max_momentum();
  if (o.three_phase()) {
    phases_ = {{o.pct_start() * total - 1, initial, 1.0, hi, lo},
               {2 * o.pct_start() * total - 2, 1.0, initial, lo, hi},
               {total - 1, initial, min, hi, hi}};
  } else {
    phases_ = {{o.pct_start() * total - 1, initial, 1.0, hi, lo}, {total - 1, 1.0, min, lo, hi}};
  }
  // Python's initial_lr is max_lr / div_factor whatever the optimizer's rate was.
  for (double& b : base_lrs_) b = max_lr_ * initial;
  if (o.cycle_momentum()) {
    const auto& opts = optimizer.defaults();
    require(dynamic_cast<const torch::optim::SGDOptions*>(&opts) || dynamic_cast<const torch::optim::AdamOptions*>(&opts) ||
                dynamic_cast<const torch::optim::AdamWOptions*>(&opts),
            "OneCycleLR: cycle_momentum needs an optimizer with a momentum or beta1 (SGD, Adam, AdamW); pass "
            "OneCycleOptions().cycle_momentum(false) for this one");
    set_momentum(hi);
  }
  initial_step();
}

double OneCycleLR::anneal(double start, double end, double pct) const {
  if (options_.anneal_strategy() == "cos") return end + (start - end) / 2.0 * (std::cos(M_PI * pct) + 1);
  return (end - start) * pct + start;
}

// The phase `epoch` falls in (the last one past its end, as Python extrapolates) and how far
// into it, in [0, 1] inside it.
std::pair<const OneCycleLR::Phase*, double> OneCycleLR::phase_at(int64_t epoch) const {
  double start_step = 0;
  const double step = static_cast<double>(epoch);
  for (size_t i = 0; i < phases_.size(); ++i) {
    const Phase& p = phases_[i];
    if (step <= p.end_step || i + 1 == phases_.size()) return {&p, (step - start_step) / (p.end_step - start_step)};
    start_step = p.end_step;
  }
  return {&phases_.back(), 1.0};
}

std::vector<double> OneCycleLR::lrs_at(int64_t epoch) const {
  if (epoch > total_steps_) {
    throw std::invalid_argument("OneCycleLR: tried to step " + std::to_string(epoch) +
                                " times; the specified number of total steps is " + std::to_string(total_steps_));
  }
  const auto [p, pct] = phase_at(epoch);
  return std::vector<double>(base_lrs_.size(), max_lr_ * anneal(p->start_lr, p->end_lr, pct));
}

double OneCycleLR::momentum_at(int64_t epoch) const {
  const auto [p, pct] = phase_at(epoch);
  return anneal(p->start_momentum, p->end_momentum, pct);
}

void OneCycleLR::set_momentum(double momentum) {
  for (auto& group : optimizer_.param_groups()) {
    auto& o = group.options();
    if (auto* sgd = dynamic_cast<torch::optim::SGDOptions*>(&o)) {
      sgd->momentum(momentum);
    } else if (auto* adam = dynamic_cast<torch::optim::AdamOptions*>(&o)) {
      adam->betas(std::make_tuple(momentum, std::get<1>(adam->betas())));
    } else if (auto* adamw = dynamic_cast<torch::optim::AdamWOptions*>(&o)) {
      adamw->betas(std::make_tuple(momentum, std::get<1>(adamw->betas())));
    }
  }
}

std::vector<double> OneCycleLR::get_lrs() {
  const int64_t epoch = static_cast<int64_t>(step_count_) + 1;
  std::vector<double> lrs = lrs_at(epoch);
  if (options_.cycle_momentum()) set_momentum(momentum_at(epoch));
  return lrs;
}

SequentialLR::SequentialLR(torch::optim::Optimizer& optimizer, std::vector<std::shared_ptr<Schedule>> schedulers,
                           std::vector<int64_t> milestones)
    : Schedule(optimizer), schedulers_(std::move(schedulers)), milestones_(std::move(milestones)) {
  require(!schedulers_.empty(), "SequentialLR: no scheduler given");
  require(milestones_.size() + 1 == schedulers_.size(),
          "SequentialLR: " + std::to_string(schedulers_.size()) + " schedulers need " +
              std::to_string(schedulers_.size() - 1) + " milestones, got " + std::to_string(milestones_.size()));
  for (size_t i = 0; i < schedulers_.size(); ++i) {
    require(schedulers_[i] != nullptr, "SequentialLR: scheduler " + std::to_string(i) + " is null");
    require(&schedulers_[i]->optimizer_ == &optimizer,
            "SequentialLR: scheduler " + std::to_string(i) + " drives another optimizer than the SequentialLR's");
  }
  for (size_t i = 1; i < milestones_.size(); ++i)
    require(milestones_[i] > milestones_[i - 1], "SequentialLR: milestones must increase");
  // Every scheduler counts from the rates before the first one changed them (Python resets the
  // groups to initial_lr); the first scheduler's are those.
  base_lrs_ = schedulers_.front()->base_lrs_;
  for (auto& s : schedulers_) s->base_lrs_ = base_lrs_;
  initial_step();
}

std::vector<double> SequentialLR::lrs_at(int64_t epoch) const {
  const size_t idx = static_cast<size_t>(std::upper_bound(milestones_.begin(), milestones_.end(), epoch) - milestones_.begin());
  const int64_t from = idx == 0 ? 0 : milestones_[idx - 1];
  return schedulers_[idx]->lrs_at(epoch - from);
}

ReduceLROnPlateau::ReduceLROnPlateau(torch::optim::Optimizer& optimizer, ReduceLROnPlateauOptions options)
    : torch::optim::LRScheduler(optimizer), optimizer_(optimizer), options_(std::move(options)) {
  const auto& o = options_;
  require(o.mode() == "min" || o.mode() == "max", "ReduceLROnPlateau: mode='" + o.mode() + "' is not known; valid: \"min\", \"max\"");
  require(o.threshold_mode() == "rel" || o.threshold_mode() == "abs",
          "ReduceLROnPlateau: threshold_mode='" + o.threshold_mode() + "' is not known; valid: \"rel\", \"abs\"");
  require(o.factor() < 1.0 && o.factor() >= 0.0, "ReduceLROnPlateau: factor=" + num(o.factor()) + " must be < 1.0 (and >= 0)");
  require(o.patience() >= 0, "ReduceLROnPlateau: patience=" + std::to_string(o.patience()) + " must be >= 0");
  require(o.cooldown() >= 0, "ReduceLROnPlateau: cooldown=" + std::to_string(o.cooldown()) + " must be >= 0");
  best_ = o.mode() == "min" ? std::numeric_limits<double>::infinity() : -std::numeric_limits<double>::infinity();
}

bool ReduceLROnPlateau::is_better(double a) const {
  const auto& o = options_;
  if (o.mode() == "min" && o.threshold_mode() == "rel") return a < best_ * (1.0 - o.threshold());
  if (o.mode() == "min") return a < best_ - o.threshold();
  if (o.threshold_mode() == "rel") return a > best_ * (o.threshold() + 1.0);
  return a > best_ + o.threshold();
}

void ReduceLROnPlateau::step(double metric) {
  ++last_epoch_;
  if (is_better(metric)) {
    best_ = metric;
    num_bad_epochs_ = 0;
  } else {
    ++num_bad_epochs_;
  }
  if (cooldown_counter_ > 0) {
    --cooldown_counter_;
    num_bad_epochs_ = 0;
  }
  if (num_bad_epochs_ > options_.patience()) {
    for (auto& group : optimizer_.param_groups()) {
      const double old_lr = group.options().get_lr();
      const double new_lr = std::max(old_lr * options_.factor(), options_.min_lr());
      if (old_lr - new_lr > options_.eps()) group.options().set_lr(new_lr);
    }
    cooldown_counter_ = options_.cooldown();
    num_bad_epochs_ = 0;
  }
}

void ReduceLROnPlateau::restore(double best, int64_t num_bad_epochs, int64_t cooldown_counter, int64_t last_epoch) {
  require(num_bad_epochs >= 0 && cooldown_counter >= 0 && last_epoch >= 0,
          "ReduceLROnPlateau: a restored count is negative (num_bad_epochs=" + std::to_string(num_bad_epochs) +
              ", cooldown_counter=" + std::to_string(cooldown_counter) + ", last_epoch=" + std::to_string(last_epoch) + ")");
  best_ = best;
  num_bad_epochs_ = num_bad_epochs;
  cooldown_counter_ = cooldown_counter;
  last_epoch_ = last_epoch;
}

std::vector<double> ReduceLROnPlateau::get_lrs() {
  throw std::logic_error("ReduceLROnPlateau steps with the monitored value: call step(value), or give its "
                         "SchedulerConfig a monitor and let the Trainer step it");
}

}  // namespace fulgur::lr_scheduler
