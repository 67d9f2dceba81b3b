// SPDX-License-Identifier: Apache-2.0
#include <fulgur/plugins/precision/grad_scaler.h>

#include <fulgur/checkpoint.h>

#include <torch/torch.h>

#include <cmath>
#include <map>
#include <sstream>
#include <stdexcept>
#include <utility>

namespace fulgur {
namespace {

std::string num(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

}  // namespace

GradScaler::GradScaler(double init_scale, double growth_factor, double backoff_factor, int64_t growth_interval)
    : growth_factor_(growth_factor),
      backoff_factor_(backoff_factor),
      growth_interval_(growth_interval),
      pending_scale_(init_scale) {
  if (!(std::isfinite(init_scale) && init_scale > 0))
    throw std::invalid_argument("GradScaler: init_scale=" + num(init_scale) + " must be finite and > 0");
  if (!(std::isfinite(growth_factor) && growth_factor > 1.0))
    throw std::invalid_argument("GradScaler: growth_factor=" + num(growth_factor) + " must be finite and > 1");
  if (!(backoff_factor > 0.0 && backoff_factor < 1.0))
    throw std::invalid_argument("GradScaler: backoff_factor=" + num(backoff_factor) + " must be in (0, 1)");
  if (growth_interval < 1)
    throw std::invalid_argument("GradScaler: growth_interval=" + std::to_string(growth_interval) + " must be >= 1");
}

void GradScaler::lazy_init(const c10::Device& device) {
  if (scale_.defined()) {
    if (scale_.device() != device) {
      scale_ = scale_.to(device);
      growth_tracker_ = growth_tracker_.to(device);
    }
    return;
  }
  scale_ = torch::full({1}, pending_scale_, torch::TensorOptions().dtype(torch::kFloat32).device(device));
  growth_tracker_ = torch::full({1}, pending_tracker_, torch::TensorOptions().dtype(torch::kInt32).device(device));
}

at::Tensor GradScaler::scale(const at::Tensor& loss) {
  lazy_init(loss.device());
  return loss * scale_.to(loss.scalar_type() == torch::kDouble ? torch::kDouble : torch::kFloat32);
}

void GradScaler::unscale(torch::optim::Optimizer& optimizer) {
  if (unscaled_) throw std::logic_error("GradScaler::unscale: already called since the last update()");
  // The gradients by (device, dtype), as the fused kernel takes one list of one device and dtype each.
  std::map<std::pair<std::string, c10::ScalarType>, std::vector<at::Tensor>> groups;
  c10::optional<c10::Device> first;
  for (auto& group : optimizer.param_groups()) {
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      at::Tensor g = p.mutable_grad();
      if (g.is_sparse()) throw std::invalid_argument("GradScaler: sparse gradients are not supported");
      if (!first) first = g.device();
      groups[{g.device().str(), g.scalar_type()}].push_back(g);
    }
  }
  const c10::Device device = scale_.defined() ? scale_.device() : first.value_or(c10::Device(c10::kCPU));
  lazy_init(device);
  found_inf_ = torch::zeros({1}, torch::TensorOptions().dtype(torch::kFloat32).device(device));
  const at::Tensor inv_scale = scale_.to(torch::kDouble).reciprocal().to(torch::kFloat32);
  for (auto& [key, grads] : groups) {
    const c10::Device d = grads.front().device();
    at::Tensor found = torch::zeros({1}, torch::TensorOptions().dtype(torch::kFloat32).device(d));
    at::_amp_foreach_non_finite_check_and_unscale_(grads, found, inv_scale.to(d));
    found_inf_ += found.to(device);
  }
  unscaled_ = true;
}

bool GradScaler::found_inf() const { return found_inf_.defined() && found_inf_.item<float>() != 0.0f; }

void GradScaler::update() {
  if (!unscaled_ || !found_inf_.defined()) {
    unscaled_ = false;
    return;  // no step was taken: nothing to learn from
  }
  at::_amp_update_scale_(scale_, growth_tracker_, found_inf_, growth_factor_, backoff_factor_, growth_interval_);
  unscaled_ = false;
  found_inf_ = at::Tensor();
}

double GradScaler::get_scale() const { return scale_.defined() ? scale_.item<double>() : pending_scale_; }

int64_t GradScaler::growth_tracker() const {
  return growth_tracker_.defined() ? growth_tracker_.item<int64_t>() : pending_tracker_;
}

c10::Dict<std::string, c10::IValue> GradScaler::state_dict() const {
  auto d = make_dict();
  d.insert("scale", get_scale());
  d.insert("growth_factor", growth_factor_);
  d.insert("backoff_factor", backoff_factor_);
  d.insert("growth_interval", growth_interval_);
  d.insert("_growth_tracker", growth_tracker());
  return d;
}

void GradScaler::load_state_dict(const c10::Dict<std::string, c10::IValue>& state, const std::string& where) {
  auto get = [&](const char* key) -> c10::IValue {
    auto it = state.find(key);
    if (it == state.end()) throw std::runtime_error(where + ": the GradScaler state has no '" + key + "'");
    return it->value();
  };
  auto real = [&](const char* key) {
    const c10::IValue v = get(key);
    if (!v.isDouble() && !v.isInt()) throw std::runtime_error(where + ": GradScaler '" + key + "' is not a number");
    return v.isDouble() ? v.toDouble() : static_cast<double>(v.toInt());
  };
  auto integer = [&](const char* key) {
    const c10::IValue v = get(key);
    if (!v.isInt()) throw std::runtime_error(where + ": GradScaler '" + key + "' is not an int");
    return v.toInt();
  };
  const double scale = real("scale");
  const int64_t tracker = integer("_growth_tracker");
  const double growth = real("growth_factor"), backoff = real("backoff_factor");
  const int64_t interval = integer("growth_interval");
  if (!(std::isfinite(scale) && scale > 0))
    throw std::runtime_error(where + ": GradScaler scale=" + num(scale) + " must be finite and > 0");
  if (tracker < 0 || tracker > interval)
    throw std::runtime_error(where + ": GradScaler _growth_tracker=" + std::to_string(tracker) + " is outside [0, " +
                             std::to_string(interval) + "]");
  try {
    GradScaler check(scale, growth, backoff, interval);
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(where + ": " + e.what());
  }
  growth_factor_ = growth;
  backoff_factor_ = backoff;
  growth_interval_ = interval;
  pending_scale_ = scale;
  pending_tracker_ = tracker;
  if (scale_.defined()) {
    scale_.fill_(scale);
    growth_tracker_.fill_(tracker);
  }
}

}  // namespace fulgur
