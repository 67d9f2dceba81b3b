// SPDX-License-Identifier: Apache-2.0
// What a worker's run sends back: rank 0's weights, metrics, loop counters,
// callback states, predictions, logger versions and (after a multi-process
// fit) its whole checkpoint, made in the worker and applied in the launching
// process.

#include <fulgur/checkpoint.h>
#include <fulgur/launchers/launcher.h>
#include <fulgur/loggers/csv_logger.h>
#include <fulgur/loggers/tensorboard_logger.h>
#include <fulgur/plugins/io/checkpoint_io.h>
#include <fulgur/strategies/strategy.h>
#include <fulgur/trainer.h>

#include "trainer/trainer_impl.h"

namespace fulgur::detail {

c10::IValue TrainerImpl::make_result(const std::vector<at::Tensor>& preds) {
  auto r = fulgur::make_dict();
  r.insert("state_dict", state_dict(*model));
  logging.materialize_metrics();
  c10::Dict<std::string, double> cm;
  for (const auto& [k, v] : logging.callback_metrics) cm.insert(k, v);
  r.insert("callback_metrics", cm);
  r.insert("current_epoch", progress.epoch);
  r.insert("global_step", progress.global_step);
  r.insert("callbacks", checkpoints.callback_states());
  if (strategy->is_global_zero()) {
    c10::List<std::string> versions;
    for (const auto& l : loggers) versions.push_back(l->version());
    r.insert("logger_versions", versions);
  }
  c10::List<at::Tensor> p;
  for (const auto& t : preds) p.push_back(t);
  r.insert("predictions", p);
  Launcher* launcher = strategy->launcher();
  if (stage == Stage::kFit && launcher && launcher->creates_processes()) {
    Checkpoint c = checkpoints.dump();  // collective: every rank dumps
    // Only rank 0's result reaches the launching process.
    if (strategy->is_global_zero()) r.insert("checkpoint", to_cpu(c10::IValue(c)));
  }
  return r;
}

void TrainerImpl::apply_result(const c10::IValue& value) {
  if (!value.isGenericDict()) return;
  auto r = c10::impl::toTypedDict<std::string, c10::IValue>(value.toGenericDict());
  load_state_dict(*model, c10::impl::toTypedDict<std::string, c10::IValue>(r.at("state_dict").toGenericDict()), true,
                  "result of rank 0");
  logging.callback_metrics.clear();
  for (const auto& kv : r.at("callback_metrics").toGenericDict()) {
    logging.callback_metrics[kv.key().toStringRef()] = kv.value().toDouble();
  }
  progress.epoch = r.at("current_epoch").toInt();
  progress.global_step = r.at("global_step").toInt();
  checkpoints.load_callback_states(r.at("callbacks"));
  std::vector<at::Tensor> predictions;
  for (const auto& t : r.at("predictions").toTensorList()) predictions.push_back(t);
  predict_loop.set_predictions(std::move(predictions));
  if (r.contains("checkpoint")) {
    checkpoints.final_checkpoint = c10::impl::toTypedDict<std::string, c10::IValue>(r.at("checkpoint").toGenericDict());
  }
  if (r.contains("logger_versions")) {
    const auto versions = r.at("logger_versions").toList();
    for (size_t i = 0; i < loggers.size() && i < versions.size(); ++i) {
      const int64_t v = std::stoll(versions.get(i).toStringRef());
      if (auto* csv = dynamic_cast<CSVLogger*>(loggers[i].get())) csv->set_version(v);
      if (auto* tb = dynamic_cast<TensorBoardLogger*>(loggers[i].get())) tb->set_version(v);
    }
  }
}

}  // namespace fulgur::detail

