// SPDX-License-Identifier: Apache-2.0
#pragma once
// The thread policy, in one place (see docs/DECISIONS.md, "Processes, threads and memory"):
// a worker gets cores / local_world_size threads (at least 1) for torch's
// intra-op pool (OpenMP, which MKL's matrix products use too), and OpenMP
// waits passively when several workers share the machine, because spinning
// threads of one worker steal the cores of the others. As Lightning does,
// fulgur decides only what the user left unset: OMP_NUM_THREADS and
// OMP_WAIT_POLICY given in the environment are kept and followed.

#include <cstdint>
#include <map>
#include <string>

namespace fulgur::runtime {

// Cores this process may run on: its CPU affinity, bounded by the cgroup v2
// CPU quota of its cgroup (a container's --cpus), rounded up.
int64_t available_cores();

// The cores the cgroup v2 quota allows: the smallest ceil(quota / period)
// over the `cpu.max` files of this process's cgroup and its ancestors, or 0
// when none sets a quota ("max") or there is no cgroup v2. `cgroup_root` is
// where cgroup2 is mounted and `self_cgroup` the file naming this process's
// cgroup ("0::/path"); the defaults are the system's, a test passes files of
// its own.
int64_t cgroup_cpu_limit(const std::string& cgroup_root = "/sys/fs/cgroup",
                         const std::string& self_cgroup = "/proc/self/cgroup");

// Threads a worker gets when `local_world_size` workers share this machine:
// the first number of OMP_NUM_THREADS when the user set it, else
// available_cores() / local_world_size (at least 1).
int64_t threads_per_worker(int64_t local_world_size);

// Environment a freshly started worker needs so OpenMP sizes its pool right
// at load time: OMP_NUM_THREADS, and OMP_WAIT_POLICY=PASSIVE with several
// workers, each only when the user has not set it.
std::map<std::string, std::string> thread_environment(int64_t local_world_size);

// Applies the policy to this (already running) process.
void apply_thread_policy(int64_t local_world_size);

}  // namespace fulgur::runtime
