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
};

RuntimeMetrics runtime_metrics();

namespace detail {
void count_compile(double seconds);
void count_execution(double flops);
void count_to_device(int64_t bytes);
void count_to_host(int64_t bytes);
}  // namespace detail

}  // namespace fulgur::xla::pjrt
