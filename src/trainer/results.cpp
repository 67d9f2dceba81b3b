// SPDX-License-Identifier: Apache-2.0
#include "trainer/results.h"

#include <torch/torch.h>

#include <algorithm>
#include <stdexcept>

namespace fulgur::detail {
namespace {

bool valid_fx(const std::string& fx) { return fx == "mean" || fx == "sum" || fx == "max" || fx == "min"; }

}  // namespace

void ResultCollection::log(const std::string& name, const at::Tensor& value_in, LogOptions options, bool in_training,
                           int64_t batch_size, const Reducer& reduce) {
  // A name is one cell of metrics.csv's header and one tag of TensorBoard's files: a line break
  // or another control character would break the line (',' and '"' are quoted there).
  const auto control = [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; };
  if (name.empty() || std::any_of(name.begin(), name.end(), control)) {
    std::string shown = name;
    std::replace_if(shown.begin(), shown.end(), control, '?');
    throw std::invalid_argument("log('" + shown + "'): a metric name must be non-empty and hold no line break or other "
                                "control character (shown as '?')");
  }
  if (!value_in.defined() || value_in.numel() != 1) {
    throw std::invalid_argument("log('" + name + "'): the value must hold one element, got shape " +
                                (value_in.defined() ? c10::str(value_in.sizes()) : std::string("undefined")));
  }
  if (!valid_fx(options.reduce_fx())) {
    throw std::invalid_argument("log('" + name + "'): reduce_fx '" + options.reduce_fx() +
                                "' is not known; valid: \"mean\", \"sum\", \"max\", \"min\"");
  }
  if (!options.on_step()) options.on_step(in_training);
  if (!options.on_epoch()) options.on_epoch(!in_training);
  at::Tensor value = value_in.detach().reshape({}).to(torch::kFloat64);
  if (options.sync_dist() && *options.on_step() && reduce) value = reduce(value, options.reduce_fx());
  auto [it, inserted] = values_.try_emplace(name);
  LoggedValue& v = it->second;
  if (inserted) v.options = options;
  v.last = value;
  v.fresh = true;
  if (!*options.on_epoch()) return;
  const double w = static_cast<double>(options.batch_size().value_or(batch_size));
  const std::string& fx = v.options.reduce_fx();
  if (!v.epoch.defined()) {
    v.epoch = fx == "mean" ? value * w : value;
    v.weight = w;
  } else if (fx == "mean") {
    v.epoch = v.epoch + value * w;
    v.weight += w;
  } else if (fx == "sum") {
    v.epoch = v.epoch + value;
  } else if (fx == "max") {
    v.epoch = torch::maximum(v.epoch, value);
  } else {
    v.epoch = torch::minimum(v.epoch, value);
  }
}

std::map<std::string, ResultCollection::Logged> ResultCollection::take_step_values() {
  std::map<std::string, Logged> out;
  for (auto& [name, v] : values_) {
    if (!v.fresh || !*v.options.on_step()) continue;
    v.fresh = false;
    out[*v.options.on_epoch() ? name + "_step" : name] = Logged{v.last, v.options.logger(), v.options.prog_bar()};
  }
  return out;
}

std::map<std::string, ResultCollection::Logged> ResultCollection::epoch_values(const Reducer& reduce) const {
  std::map<std::string, Logged> out;
  for (const auto& [name, v] : values_) {
    if (!*v.options.on_epoch() || !v.epoch.defined()) continue;
    const std::string& fx = v.options.reduce_fx();
    at::Tensor value = v.epoch;
    if (fx == "mean") {
      if (v.options.sync_dist() && reduce) {
        // Weighted mean over every rank's samples.
        auto both = torch::stack({v.epoch, torch::full({}, v.weight, torch::kFloat64).to(v.epoch.device())});
        both = reduce(both, "sum");
        value = both[0] / both[1];
      } else {
        value = v.epoch / v.weight;
      }
    } else if (v.options.sync_dist() && reduce) {
      value = reduce(value, fx);
    }
    out[*v.options.on_step() ? name + "_epoch" : name] = Logged{value, v.options.logger(), v.options.prog_bar()};
    if (*v.options.on_step()) out[name] = Logged{value, false, false};
  }
  return out;
}

std::map<std::string, double> to_doubles(const std::map<std::string, ResultCollection::Logged>& values) {
  std::map<std::string, double> out;
  for (const auto& [k, v] : values) out[k] = v.value.item<double>();
  return out;
}

}  // namespace fulgur::detail
