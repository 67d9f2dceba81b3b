#include "runtime/threads.h"

#include <ATen/Parallel.h>

#include <sched.h>

#include <algorithm>
#include <thread>

namespace fulgur::runtime {

int64_t available_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

int64_t threads_per_worker(int64_t local_world_size) {
  return std::max<int64_t>(1, available_cores() / std::max<int64_t>(1, local_world_size));
}

std::map<std::string, std::string> thread_environment(int64_t local_world_size) {
  const std::string n = std::to_string(threads_per_worker(local_world_size));
  std::map<std::string, std::string> env{{"OMP_NUM_THREADS", n}};
  if (local_world_size > 1) env["OMP_WAIT_POLICY"] = "PASSIVE";
  return env;
}

void apply_thread_policy(int64_t local_world_size) {
  const int n = static_cast<int>(threads_per_worker(local_world_size));
  at::set_num_threads(n);
}

}  // namespace fulgur::runtime
