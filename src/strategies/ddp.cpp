// SPDX-License-Identifier: Apache-2.0
#include <fulgur/accelerators/accelerator.h>
#include <fulgur/lightning_module.h>
#include <fulgur/plugins/precision/precision.h>
#include <fulgur/strategies/ddp.h>
#include <fulgur/trainer.h>

#include "distributed/gradient_sync.h"
#include "trainer/run_context.h"

namespace fulgur {

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
  if (detail::run_context(trainer).stage() == Stage::kFit && collectives_ && world_size() > 1) gradient_sync_ = make_gradient_sync();
}

std::unique_ptr<detail::GradientSync> DDPStrategy::make_gradient_sync() {
  detail::BucketOptions buckets;
  buckets.comm_hook = options_.ddp_comm_hook();
  return detail::make_bucket_reducer(detail::unique_trainable_parameters(*model_), collectives_, buckets);
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

}  // namespace fulgur
