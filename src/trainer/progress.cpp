// SPDX-License-Identifier: Apache-2.0
#include "trainer/progress.h"

#include "trainer/checkpoint_read.h"

namespace fulgur::detail {

c10::Dict<std::string, c10::IValue> Progress::to_ivalue(int64_t world_size) const {
  auto loop = fulgur::make_dict();
  loop.insert("epoch", epoch);
  loop.insert("batches_done", batches_done);
  loop.insert("epoch_finished", epoch_finished);
  loop.insert("epoch_schedulers_stepped", epoch_schedulers_stepped);
  loop.insert("global_step", global_step);
  loop.insert("world_size", world_size);
  return loop;
}

Progress Progress::from_checkpoint(const Checkpoint& checkpoint, const std::string& where, int64_t batches_per_epoch) {
  auto entry = [&](const char* key, const c10::TypePtr& type) {
    return checkpoint_entry(checkpoint, {"loops", "fit_loop", key}, where, type);
  };
  auto count = [&](const char* key, int64_t bound, const std::string& why) {
    return check_count(entry(key, c10::IntType::get()).toInt(), where, std::string("loops.fit_loop.") + key, bound, why);
  };
  Progress p;
  p.epoch = count("epoch", kMaxLoopCount, "no run gets that far");
  p.global_step = count("global_step", kMaxLoopCount, "no run gets that far");
  p.batches_done = count("batches_done", batches_per_epoch, "the batches of one epoch of this run's training loader");
  p.epoch_finished = entry("epoch_finished", c10::BoolType::get()).toBool();
  const auto fit_loop = checkpoint_entry(checkpoint, {"loops", "fit_loop"}, where).toGenericDict();
  p.epoch_schedulers_stepped =
      fit_loop.contains("epoch_schedulers_stepped") && entry("epoch_schedulers_stepped", c10::BoolType::get()).toBool();
  return p;
}

}  // namespace fulgur::detail
