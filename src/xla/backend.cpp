// SPDX-License-Identifier: Apache-2.0
#include <fulgur/xla/backend.h>

#include <ATen/FunctionalTensorWrapper.h>

#include "runtime/env.h"

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <sstream>
#include <stdexcept>


namespace fulgur::xla {
namespace {

class EagerBackend : public Backend {
 public:
  std::string name() const override { return "eager"; }
  c10::Device device() const override { return c10::Device(c10::kCPU); }
  void mark_step() override {}
  // metrics(): the zeros of Backend::metrics.
};

std::unique_ptr<Backend>& instance() {
  static std::unique_ptr<Backend> b;
  return b;
}

}  // namespace

std::unique_ptr<Backend> make_lazy_backend(bool pjrt);  // lazy_backend.cpp

void Backend::copy_to_host(const at::Tensor& tensor, const at::Tensor& dst) const {
  dst.copy_(tensor.to(at::kCPU).reshape({-1}));
}

at::Tensor Backend::from_host(const at::Tensor& host, const c10::Device& device) const {
  // A lazy tensor keeps a reference to the data it was made from: give it its own copy.
  return host.clone().to(device);
}

std::string Backend::metrics_report() const {
  const BackendMetrics m = metrics();
  std::ostringstream o;
  char buf[64];
  o << "fulgur xla metrics (backend: " << name() << ", device: " << device() << ")\n";
  o << "  mark_steps:       " << m.mark_steps << "\n";
  o << "  graphs compiled:  " << m.graphs_compiled << "\n";
  o << "  cache hits:       " << m.cache_hits << "\n";
  std::snprintf(buf, sizeof buf, "%.3f", m.compile_seconds);
  o << "  compile seconds:  " << buf << "  (mark_steps that compiled a graph, their execution included)\n";
  std::snprintf(buf, sizeof buf, "%.3f", m.execute_seconds);
  o << "  execute seconds:  " << buf << "  (the other mark_steps)\n";
  o << "  eager fallbacks:  ";
  if (m.eager_fallbacks.empty()) o << "none";
  bool first = true;
  for (const auto& [op, n] : m.eager_fallbacks) {
    o << (first ? "" : ", ") << op << "=" << n;
    first = false;
  }
  o << "\n";
  o << backend_report();
  if (m.eager_fallbacks.count("aten::_local_scalar_dense")) {
    o << "    (aten::_local_scalar_dense is item(); the others ran on the CPU outside the graph)\n";
  }
  return o.str();
}

Backend& backend() {
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  auto& b = instance();
  if (!b) {
    const std::string set = runtime::env_string("FULGUR_XLA_BACKEND");
    const std::string name = set.empty() ? "pjrt" : set;
    if (name == "eager") {
      b = std::make_unique<EagerBackend>();
    } else if (name == "ts" || name == "lazy") {  // "lazy": the name before "pjrt" existed
      b = make_lazy_backend(false);
    } else if (name == "pjrt") {
      b = make_lazy_backend(true);
    } else {
      throw std::invalid_argument("FULGUR_XLA_BACKEND='" + name +
                                  "' is not a backend; valid: \"pjrt\" (the default), \"ts\", \"eager\"");
    }
  }
  return *b;
}

bool backend_started() { return instance() != nullptr; }

void mark_step() {
  if (backend_started()) instance()->mark_step();
}

BackendMetrics metrics() { return backend_started() ? instance()->metrics() : BackendMetrics{}; }

std::string metrics_report() {
  if (!backend_started()) return "fulgur xla metrics: the xla backend has not started\n";
  return instance()->metrics_report();
}

void note_inputs(const std::vector<at::Tensor>& inputs) {
  if (backend_started()) instance()->note_inputs(inputs);
}

void apply_pending_updates(const std::vector<at::Tensor>& tensors) {
  for (const auto& t : tensors) {
    if (t.defined() && at::functionalization::impl::isFunctionalTensor(t)) {
      at::functionalization::impl::unsafeGetFunctionalWrapper(t)->apply_updates();
    }
  }
}

}  // namespace fulgur::xla
