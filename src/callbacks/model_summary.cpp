// SPDX-License-Identifier: Apache-2.0
#include <fulgur/callbacks/model_summary.h>
#include <fulgur/lightning_module.h>
#include <fulgur/trainer.h>

#include "runtime/log.h"

#include <torch/nn/module.h>

#include <algorithm>
#include <cstdio>

namespace fulgur {
namespace {

// "torch::nn::LinearImpl" -> "Linear"; a name given by the user stays as it is.
std::string short_type(std::string type) {
  const std::string ns = "torch::nn::";
  if (type.rfind(ns, 0) == 0) {
    type = type.substr(ns.size());
    if (type.size() > 4 && type.compare(type.size() - 4, 4, "Impl") == 0) type.resize(type.size() - 4);
  }
  return type;
}

std::string pad(const std::string& s, size_t width) { return s + std::string(width - std::min(width, s.size()), ' '); }

}  // namespace

ModelSummaryTable summarize(const torch::nn::Module& module) {
  ModelSummaryTable table;
  for (const auto& child : module.named_children()) {
    int64_t n = 0;
    for (const auto& p : child.value()->parameters(true)) n += p.numel();
    table.rows.push_back({child.key(), short_type(child.value()->name()), n});
  }
  double bytes = 0;
  for (const auto& p : module.parameters(true)) {
    (p.requires_grad() ? table.trainable_params : table.non_trainable_params) += p.numel();
    bytes += static_cast<double>(p.numel()) * static_cast<double>(p.element_size());
  }
  table.size_mb = bytes / 1e6;
  return table;
}

std::vector<std::string> format_summary(const ModelSummaryTable& table) {
  size_t idx_w = std::to_string(table.rows.empty() ? 0 : table.rows.size() - 1).size();
  size_t name_w = 4, type_w = 4, params_w = 6;
  for (const auto& r : table.rows) {
    name_w = std::max(name_w, r.name.size());
    type_w = std::max(type_w, r.type.size());
    params_w = std::max(params_w, std::to_string(r.params).size());
  }
  std::vector<std::string> out;
  out.push_back(pad("", idx_w) + " | " + pad("Name", name_w) + " | " + pad("Type", type_w) + " | Params");
  const std::string rule(idx_w + name_w + type_w + params_w + 9, '-');
  out.push_back(rule);
  for (size_t i = 0; i < table.rows.size(); ++i) {
    const auto& r = table.rows[i];
    out.push_back(pad(std::to_string(i), idx_w) + " | " + pad(r.name, name_w) + " | " + pad(r.type, type_w) + " | " +
                  std::to_string(r.params));
  }
  out.push_back(rule);
  out.push_back(pad(std::to_string(table.trainable_params), 10) + "Trainable params");
  out.push_back(pad(std::to_string(table.non_trainable_params), 10) + "Non-trainable params");
  out.push_back(pad(std::to_string(table.total_params()), 10) + "Total params");
  char mb[32];
  std::snprintf(mb, sizeof(mb), "%.3f", table.size_mb);
  out.push_back(pad(mb, 10) + "Total estimated model params size (MB)");
  return out;
}

void ModelSummary::on_fit_start(Trainer& trainer, LightningModule& model) {
  if (!trainer.is_global_zero() || !runtime::log_enabled(runtime::LogLevel::kInfo)) return;
  for (const auto& line : format_summary(summarize(model))) runtime::log_rank_zero(runtime::LogLevel::kInfo, line);
}

}  // namespace fulgur
