// SPDX-License-Identifier: Apache-2.0
#pragma once
// Counters of the PJRT runtime, for the whole process (every client). Thread-safe.

#include <cstdint>

namespace fulgur::xla::pjrt {

struct RuntimeMetrics {
  int64_t programs_compiled = 0;  // successful PJRT_Client_Compile calls
  double compile_seconds = 0;     // wall time in them
  int64_t executions = 0;         // PJRT_LoadedExecutable_Execute calls that were accepted
  // Sum of Executable::flops() over those executions whose program has a cost analysis, and
  // the number of executions without one.
  double executed_flops = 0;
  int64_t executions_without_flops = 0;
  int64_t bytes_to_device = 0;    // host -> device (Client::to_device)
  int64_t bytes_to_host = 0;      // device -> host (Buffer::to_host)
  // The compile cache (compile_cache.h), when a folder is set: programs loaded from it instead of
  // compiled (hits), programs compiled while it was on (misses, a rejected entry's included),
  // entries refused (corrupt, truncated, foreign, not this user's, or refused by the plugin),
  // and the bytes of entries read and written.
  int64_t cache_hits = 0;
  int64_t cache_misses = 0;
  int64_t cache_rejected = 0;
  int64_t cache_bytes_read = 0;
  int64_t cache_bytes_written = 0;
};

RuntimeMetrics runtime_metrics();

namespace detail {
void count_compile(double seconds);
void count_execution(double flops);
void count_to_device(int64_t bytes);
void count_to_host(int64_t bytes);
void count_cache_hit();
void count_cache_miss();
void count_cache_rejected();
void count_cache_bytes_read(int64_t bytes);
void count_cache_bytes_written(int64_t bytes);
}  // namespace detail

}  // namespace fulgur::xla::pjrt
