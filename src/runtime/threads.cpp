// SPDX-License-Identifier: Apache-2.0
#include "runtime/threads.h"

#include "runtime/env.h"

#include <ATen/Parallel.h>

#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

namespace fulgur::runtime {
namespace {

// ceil(quota / period) of one cpu.max file ("<quota> <period>", or "max
// <period>" for no quota); 0 when it sets no quota or cannot be read.
int64_t quota_cores(const std::filesystem::path& cpu_max) {
  std::ifstream in(cpu_max);
  std::string quota;
  long long period = 0;
  if (!(in >> quota >> period) || quota == "max" || period <= 0) return 0;
  char* end = nullptr;
  const long long q = std::strtoll(quota.c_str(), &end, 10);
  if (*end != '\0' || q <= 0) return 0;
  return std::max<int64_t>(1, (q + period - 1) / period);
}

}  // namespace

int64_t cgroup_cpu_limit(const std::string& cgroup_root, const std::string& self_cgroup) {
  // cgroup v2 has one line, "0::<path>"; v1's numbered controllers are not read.
  std::ifstream in(self_cgroup);
  std::string path;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("0::", 0) == 0) path = line.substr(3);
  }
  if (path.empty()) return 0;
  // A quota on any ancestor bounds the cgroups below it: the root's folder,
  // then each component of the path.
  std::filesystem::path dir(cgroup_root);
  int64_t limit = quota_cores(dir / "cpu.max");
  for (const auto& part : std::filesystem::path(path).relative_path()) {
    if (part.empty() || part == "..") continue;
    dir /= part;
    const int64_t n = quota_cores(dir / "cpu.max");
    if (n > 0) limit = limit == 0 ? n : std::min(limit, n);
  }
  return limit;
}

int64_t available_cores() {
  int64_t cores = std::max(1u, std::thread::hardware_concurrency());
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) cores = std::max(1, CPU_COUNT(&set));
  const int64_t quota = cgroup_cpu_limit();
  return quota > 0 ? std::min(cores, quota) : cores;
}

int64_t threads_per_worker(int64_t local_world_size) {
  // Validated by the Trainer's constructor (positive integers separated by commas).
  if (const char* user = env_value("OMP_NUM_THREADS")) return std::max<int64_t>(1, std::atoll(user));
  return std::max<int64_t>(1, available_cores() / std::max<int64_t>(1, local_world_size));
}

std::map<std::string, std::string> thread_environment(int64_t local_world_size) {
  std::map<std::string, std::string> env;
  if (!env_set("OMP_NUM_THREADS")) env["OMP_NUM_THREADS"] = std::to_string(threads_per_worker(local_world_size));
  if (local_world_size > 1 && !env_set("OMP_WAIT_POLICY")) env["OMP_WAIT_POLICY"] = "PASSIVE";
  return env;
}

void apply_thread_policy(int64_t local_world_size) {
  const int n = static_cast<int>(threads_per_worker(local_world_size));
  at::set_num_threads(n);
}

}  // namespace fulgur::runtime
