// SPDX-License-Identifier: Apache-2.0
// The lazy backend: torch::lazy with the TorchScript backend (libtorch 1.13).
// Operations on c10::kLazy tensors are recorded; mark_step() compiles the
// pending graph (or takes it from the compile cache, keyed by graph hash) and
// runs it. The TorchScript backend's device data is CPU memory.
//
// 1.13 has no compile/execute time metrics, so mark_step times itself and
// counts a step as a compile step when the UncachedCompile counter grew.

#include <fulgur/xla/backend.h>

#include "runtime/log.h"
#include "xla/lazy_random.h"
#include "xla/lazy_views.h"
#include "xla/pjrt/compile_cache.h"
#include "xla/pjrt/client.h"
#include "xla/pjrt/metrics.h"
#include "xla/pjrt_backend.h"


#include <torch/torch.h>

#include <torch/csrc/lazy/backend/backend_device.h>
#include <torch/csrc/lazy/core/lazy_graph_executor.h>
#include <torch/csrc/lazy/core/metrics.h>
#include <torch/csrc/lazy/ts_backend/ts_backend_impl.h>

#include <chrono>
#include <cstdio>
#include <mutex>
#include <set>
#include <sstream>

namespace fulgur::xla {
namespace {

// A compile after this many steps (noted batches, or mark_steps when no batch
// was noted) is a recompilation worth a warning.
constexpr int64_t kWarmupSteps = 5;
// After this many recompilations with batch input shapes seen before, one
// warning that the graph itself keeps changing.
constexpr int64_t kUnexplainedRecompiles = 10;

int64_t counter(const char* name) {
  auto* c = torch::lazy::GetCounter(name);
  return c ? c->Value() : 0;
}

std::map<std::string, int64_t> fallback_counters() {
  std::map<std::string, int64_t> out;
  for (const auto& n : torch::lazy::GetCounterNames()) {
    if (n.rfind("aten::", 0) != 0) continue;
    const int64_t v = counter(n.c_str());
    if (v > 0) out[n] = v;
  }
  return out;
}

// Shapes and dtypes of a step's inputs.
struct Signature {
  std::vector<std::string> shapes;
  std::vector<c10::ScalarType> dtypes;
  bool empty() const { return shapes.empty(); }
  std::string key() const {
    std::string k;
    for (size_t i = 0; i < shapes.size(); ++i) {
      k += shapes[i];
      k += c10::toString(dtypes[i]);
      k += ';';
    }
    return k;
  }
};

Signature signature_of(const std::vector<at::Tensor>& inputs) {
  Signature s;
  for (const auto& t : inputs) {
    if (!t.defined()) {
      s.shapes.emplace_back("undefined");
      s.dtypes.push_back(c10::ScalarType::Undefined);
      continue;
    }
    std::ostringstream o;
    o << t.sizes();  // "[64, 1, 28, 28]"
    s.shapes.push_back(o.str());
    s.dtypes.push_back(t.scalar_type());
  }
  return s;
}

// "from [64, 1, 28, 28] to [17, 1, 28, 28]", naming only the inputs that differ.
std::string describe_change(const Signature& from, const Signature& to) {
  auto item = [](const Signature& s, size_t i, bool with_dtype) {
    std::string r = s.shapes[i];
    if (with_dtype && s.dtypes[i] != c10::ScalarType::Undefined) r += std::string(" ") + c10::toString(s.dtypes[i]);
    return r;
  };
  auto join = [&](const Signature& s, const std::vector<size_t>& idx, bool with_dtype) {
    std::string r;
    for (size_t j = 0; j < idx.size(); ++j) r += (j ? ", " : "") + item(s, idx[j], with_dtype);
    return r;
  };
  if (from.empty()) {
    std::vector<size_t> all(to.shapes.size());
    for (size_t i = 0; i < all.size(); ++i) all[i] = i;
    return "batch input shapes are " + join(to, all, false);
  }
  std::vector<size_t> a, b;
  bool dtype_changed = false;
  if (from.shapes.size() == to.shapes.size()) {
    for (size_t i = 0; i < to.shapes.size(); ++i) {
      if (from.shapes[i] != to.shapes[i] || from.dtypes[i] != to.dtypes[i]) a.push_back(i);
      dtype_changed = dtype_changed || from.dtypes[i] != to.dtypes[i];
    }
    b = a;
  } else {
    for (size_t i = 0; i < from.shapes.size(); ++i) a.push_back(i);
    for (size_t i = 0; i < to.shapes.size(); ++i) b.push_back(i);
  }
  return std::string("batch input ") + (dtype_changed ? "shapes/dtypes" : "shapes") + " changed from " +
         join(from, a, dtype_changed) + " to " + join(to, b, dtype_changed);
}

// The pjrt backend's lines of metrics_report(): XLA's compiles and executions, the transfers, the
// graphs kept on TorchScript and the compile cache.
std::string pjrt_report(const BackendMetrics& m) {
  std::ostringstream o;
  char buf[64];
  o << "  xla graphs compiled: " << m.xla_graphs_compiled << "\n";
  std::snprintf(buf, sizeof buf, "%.3f", m.xla_compile_seconds);
  o << "  xla compile seconds: " << buf << "  (StableHLO emission and PJRT compile, or compile cache load)\n";
  o << "  xla executions:      " << m.xla_executions << "\n";
  std::snprintf(buf, sizeof buf, "%.4g", m.xla_executed_flops);
  o << "  xla executed flops:  " << buf << "  (XLA's cost analysis of each program run)\n";
  o << "  bytes to device:     " << m.bytes_to_device << "\n";
  o << "  bytes to host:       " << m.bytes_to_host << "\n";
  o << "  buffers donated:     " << m.xla_buffers_donated << " (" << m.xla_bytes_donated
    << " bytes reused in place)\n";
  o << "  convolutions:        " << (m.xla_host_convolutions ? "libtorch's kernels (host kernels)" : "XLA's own")
    << "\n";
  o << "  graphs kept on TorchScript, by op: ";
  if (m.xla_fallbacks.empty()) o << "none";
  bool f = true;
  for (const auto& [op, n] : m.xla_fallbacks) {
    o << (f ? "" : ", ") << op << "=" << n;
    f = false;
  }
  o << "\n";
  o << "  runs of those graphs on TorchScript: " << m.ts_fallback_executions << "\n";
  const pjrt::RuntimeMetrics r = pjrt::runtime_metrics();
  const std::optional<std::string> cache = pjrt::compile_cache_dir();
  o << "  PJRT compiles:       " << r.programs_compiled << "\n";
  o << "  compile cache:       " << (cache ? *cache : std::string("off")) << "\n";
  o << "    hits " << r.cache_hits << ", misses " << r.cache_misses << ", entries refused " << r.cache_rejected
    << "; bytes read " << r.cache_bytes_read << ", written " << r.cache_bytes_written << "\n";
  return o.str();
}

// torch::lazy on libtorch's TorchScript backend ("ts"), the reference; PjrtLazyBackend below
// replaces its compile and device data with XLA's.
class LazyBackend : public Backend {
 public:
  LazyBackend() : LazyBackend([] {
    static std::once_flag once;
    std::call_once(once, [] { torch::lazy::InitTorchScriptBackend(); });
  }) {}

 protected:
  // `start_backend` registers the lazy core's backend; the Lazy-key kernels are installed around it.
  explicit LazyBackend(void (*start_backend)()) {
    detail::install_lazy_view_kernels();
    start_backend();
    // After the TorchScript backend's start, which registers the lazy core's kernels of the
    // same ops (they would replace these).
    detail::install_lazy_random_kernels();
    seen_uncached_ = counter("UncachedCompile");
  }

 public:
  std::string name() const override { return "ts"; }
  c10::Device device() const override { return c10::Device(c10::kLazy, 0); }

  void mark_step() override {
    const auto t0 = std::chrono::steady_clock::now();
    {
      torch::lazy::BackendDevice dev;  // the default device of the backend (lazy:0)
      auto* ex = torch::lazy::LazyGraphExecutor::Get();
      ex->SyncLiveTensorsGraph(&dev, /*devices=*/{}, /*wait=*/true);
      ex->MarkStep(dev);
    }
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const int64_t uncached = counter("UncachedCompile");

    std::lock_guard<std::mutex> lock(mu_);
    ++mark_steps_;
    ++mark_steps_since_reset_;
    const bool compiled = uncached > seen_uncached_;
    seen_uncached_ = uncached;
    (compiled ? compile_seconds_ : execute_seconds_) += dt;
    if (compiled) on_compile(uncached);
  }

  void reset() override {
    std::lock_guard<std::mutex> lock(mu_);
    // Keep the cumulative numbers and the last report; then drop the compiled
    // graphs and zero torch::lazy's counters.
    last_report_ = torch::lazy::CreateMetricReport();
    base_compiled_ += counter("UncachedCompile");
    base_hits_ += counter("CachedCompile");
    for (const auto& [op, n] : fallback_counters()) base_fallbacks_[op] += n;
    if (auto* cache = torch::lazy::LazyGraphExecutor::Get()->GetComputationCache()) cache->Clear();
    torch::lazy::MetricsArena::Get()->ResetCounters();
    torch::lazy::MetricsArena::Get()->ResetMetrics();
    seen_uncached_ = counter("UncachedCompile");
    steps_noted_ = 0;
    mark_steps_since_reset_ = 0;
    current_ = Signature{};
    previous_ = Signature{};
    compiled_signatures_.clear();
    unexplained_ = 0;
  }

  BackendMetrics metrics() const override {
    std::lock_guard<std::mutex> lock(mu_);
    BackendMetrics m;
    m.graphs_compiled = base_compiled_ + counter("UncachedCompile");
    m.cache_hits = base_hits_ + counter("CachedCompile");
    m.mark_steps = mark_steps_;
    m.eager_fallbacks = base_fallbacks_;
    for (const auto& [op, n] : fallback_counters()) m.eager_fallbacks[op] += n;
    m.compile_seconds = compile_seconds_;
    m.execute_seconds = execute_seconds_;
    return m;
  }

  std::string metrics_report() const override {
    std::string r = Backend::metrics_report();
    r += "--- torch::lazy metrics ---\n";
    r += torch::lazy::CreateMetricReport();
    std::string last;
    {
      std::lock_guard<std::mutex> lock(mu_);
      last = last_report_;
    }
    if (!last.empty()) r += "--- torch::lazy metrics before the last reset() ---\n" + last;
    return r;
  }

  void note_inputs(const std::vector<at::Tensor>& inputs) override {
    Signature s = signature_of(inputs);
    std::lock_guard<std::mutex> lock(mu_);
    ++steps_noted_;
    if (s.key() != current_.key()) {
      previous_ = std::move(current_);
      current_ = std::move(s);
    }
  }

 private:
  // Called with mu_ held after a mark_step that compiled a graph.
  void on_compile(int64_t uncached) {
    // The step: the index of the last noted batch, or of this mark_step.
    const int64_t step = steps_noted_ > 0 ? steps_noted_ - 1 : mark_steps_since_reset_ - 1;
    const bool after_warmup = step >= kWarmupSteps;
    const int64_t compiled_so_far = base_compiled_ + uncached;
    if (!current_.empty()) {
      const bool new_signature = compiled_signatures_.insert(current_.key()).second;
      if (new_signature) {
        if (after_warmup) {
          // Every rank compiles the same graphs: rank 0 tells.
          runtime::log_rank_zero(runtime::LogLevel::kWarning,
                                 "xla graph recompiled at step " + std::to_string(step) + " (" +
                                     std::to_string(compiled_so_far) + " graphs compiled so far); " +
                                     describe_change(previous_, current_) + "; pad the last batch or use drop_last");
        }
        return;
      }
    }
    if (after_warmup && ++unexplained_ == kUnexplainedRecompiles) {
      runtime::log_rank_zero(runtime::LogLevel::kWarning,
                             "xla graphs keep being recompiled (" + std::to_string(compiled_so_far) +
                                 " graphs compiled so far, " + std::to_string(unexplained_) +
                                 " after warm-up with batch input shapes seen before): the traced graph changes "
                                 "between steps. Look for item() or prints inside the step, data-dependent shapes, "
                                 "or scalars that change every step; fulgur::xla::metrics_report() has details");
    }
  }

  mutable std::mutex mu_;
  int64_t seen_uncached_ = 0;
  int64_t mark_steps_ = 0;
  int64_t mark_steps_since_reset_ = 0;
  double compile_seconds_ = 0.0;
  double execute_seconds_ = 0.0;
  int64_t base_compiled_ = 0;
  int64_t base_hits_ = 0;
  std::map<std::string, int64_t> base_fallbacks_;
  std::string last_report_;
  int64_t steps_noted_ = 0;
  Signature current_, previous_;
  std::set<std::string> compiled_signatures_;
  int64_t unexplained_ = 0;
};

// The default backend ("pjrt"): the lazy core's graphs compiled by XLA through the process's PJRT
// client, device data in PJRT buffers (pjrt_backend.cpp).
class PjrtLazyBackend final : public LazyBackend {
 public:
  PjrtLazyBackend() : LazyBackend(install_pjrt_lazy_backend) {}

  std::string name() const override { return "pjrt"; }
  // XLA compiles the update into the backward: one graph per step.
  bool update_joins_backward_graph() const override { return true; }

  void copy_to_host(const at::Tensor& tensor, const at::Tensor& dst) const override {
    // A value in a PJRT buffer is read straight into `dst`.
    if (!copy_device_value_to_host(tensor, dst)) Backend::copy_to_host(tensor, dst);
  }

  at::Tensor from_host(const at::Tensor& host, const c10::Device& device) const override {
    return device_tensor_from_host(host, device);
  }

  std::map<std::string, int64_t> device_memory_stats() const override { return pjrt::process_client().memory_stats(); }

  BackendMetrics metrics() const override {
    BackendMetrics m = LazyBackend::metrics();
    const PjrtBackendMetrics p = pjrt_backend_metrics();
    m.xla_graphs_compiled = p.graphs_compiled;
    m.xla_compile_seconds = p.compile_seconds;
    m.xla_executions = p.executions;
    const pjrt::RuntimeMetrics r = pjrt::runtime_metrics();
    m.xla_executed_flops = r.executed_flops;
    m.xla_executions_without_flops = r.executions_without_flops;
    m.bytes_to_device = p.bytes_to_device;
    m.bytes_to_host = p.bytes_to_host;
    m.xla_fallbacks = p.fallbacks;
    m.ts_fallback_executions = p.fallback_executions;
    m.xla_host_convolutions = p.host_convolutions;
    m.xla_buffers_donated = p.buffers_donated;
    m.xla_bytes_donated = p.bytes_donated;
    return m;
  }

 protected:
  std::string backend_report() const override { return pjrt_report(metrics()); }
};

}  // namespace

std::unique_ptr<Backend> make_lazy_backend(bool pjrt) {
  if (pjrt) return std::make_unique<PjrtLazyBackend>();
  return std::make_unique<LazyBackend>();
}

}  // namespace fulgur::xla
