// SPDX-License-Identifier: Apache-2.0
#include "xla/pjrt/metrics.h"

#include <atomic>

namespace fulgur::xla::pjrt {
namespace {

std::atomic<int64_t> programs_compiled{0}, compile_ns{0}, executions{0}, bytes_to_device{0}, bytes_to_host{0},
    executions_without_flops{0};
std::atomic<double> executed_flops{0};
std::atomic<int64_t> cache_hits{0}, cache_misses{0}, cache_rejected{0}, cache_bytes_read{0}, cache_bytes_written{0};

}  // namespace

RuntimeMetrics runtime_metrics() {
  RuntimeMetrics m;
  m.programs_compiled = programs_compiled.load();
  m.compile_seconds = static_cast<double>(compile_ns.load()) * 1e-9;
  m.executions = executions.load();
  m.executed_flops = executed_flops.load();
  m.executions_without_flops = executions_without_flops.load();
  m.bytes_to_device = bytes_to_device.load();
  m.bytes_to_host = bytes_to_host.load();
  m.cache_hits = cache_hits.load();
  m.cache_misses = cache_misses.load();
  m.cache_rejected = cache_rejected.load();
  m.cache_bytes_read = cache_bytes_read.load();
  m.cache_bytes_written = cache_bytes_written.load();
  return m;
}

namespace detail {
void count_compile(double seconds) {
  programs_compiled.fetch_add(1);
  compile_ns.fetch_add(static_cast<int64_t>(seconds * 1e9));
}
void count_execution(double flops) {
  executions.fetch_add(1);
  if (flops < 0) {
    executions_without_flops.fetch_add(1);
    return;
  }
  // std::atomic<double>::fetch_add is C++20; this project builds as C++17.
  double seen = executed_flops.load();
  while (!executed_flops.compare_exchange_weak(seen, seen + flops)) {
  }
}
void count_to_device(int64_t bytes) { bytes_to_device.fetch_add(bytes); }
void count_to_host(int64_t bytes) { bytes_to_host.fetch_add(bytes); }
void count_cache_hit() { cache_hits.fetch_add(1); }
void count_cache_miss() { cache_misses.fetch_add(1); }
void count_cache_rejected() { cache_rejected.fetch_add(1); }
void count_cache_bytes_read(int64_t bytes) { cache_bytes_read.fetch_add(bytes); }
void count_cache_bytes_written(int64_t bytes) { cache_bytes_written.fetch_add(bytes); }
}  // namespace detail

}  // namespace fulgur::xla::pjrt
