// SPDX-License-Identifier: Apache-2.0
#include <fulgur/callbacks/gradient_accumulation_scheduler.h>
#include <fulgur/lightning_module.h>
#include <fulgur/trainer.h>

#include <stdexcept>

namespace fulgur {
namespace {

std::string listed(const std::map<int64_t, int64_t>& m, bool keys) {
  std::string out;
  for (const auto& [k, v] : m) out += (out.empty() ? "" : ", ") + std::to_string(keys ? k : v);
  return "[" + out + "]";
}

}  // namespace

GradientAccumulationScheduler::GradientAccumulationScheduler(std::map<int64_t, int64_t> scheduling)
    : scheduling_(std::move(scheduling)) {
  if (scheduling_.empty()) {
    throw std::invalid_argument(
        "GradientAccumulationScheduler: the scheduling is empty; give at least one {epoch, accumulate_grad_batches} "
        "pair, e.g. {{0, 2}}");
  }
  for (const auto& [epoch, k] : scheduling_) {
    if (epoch < 0) {
      throw std::invalid_argument("GradientAccumulationScheduler: epoch " + std::to_string(epoch) +
                                  " is negative; epochs are >= 0 (got the epochs " + listed(scheduling_, true) + ")");
    }
    if (k < 1) {
      throw std::invalid_argument("GradientAccumulationScheduler: accumulate_grad_batches=" + std::to_string(k) +
                                  " for epoch " + std::to_string(epoch) + " must be >= 1 (got the counts " +
                                  listed(scheduling_, false) + ")");
    }
  }
  // Lightning's rule: the epochs before the first key accumulate nothing.
  scheduling_.emplace(0, 1);
}

int64_t GradientAccumulationScheduler::get_accumulate_grad_batches(int64_t epoch) const {
  auto it = scheduling_.upper_bound(epoch);
  return it == scheduling_.begin() ? 1 : std::prev(it)->second;
}

bool GradientAccumulationScheduler::going_to_accumulate_grad_batches() const {
  for (const auto& kv : scheduling_)
    if (kv.second > 1) return true;
  return false;
}

void GradientAccumulationScheduler::on_train_start(Trainer&, LightningModule& module) {
  if (!module.automatic_optimization()) {
    throw std::logic_error(
        "GradientAccumulationScheduler works under automatic optimization only; this module calls "
        "set_automatic_optimization(false). Remove the callback, or accumulate in training_step yourself");
  }
}

void GradientAccumulationScheduler::on_train_epoch_start(Trainer& trainer, LightningModule&) {
  trainer.set_accumulate_grad_batches(get_accumulate_grad_batches(trainer.current_epoch()));
}

}  // namespace fulgur
