#pragma once
// The thread policy, in one place (see docs/ARCHITECTURE.md, "Threads"):
// a worker gets cores / local_world_size threads (at least 1) for torch's
// intra-op pool (OpenMP, which MKL's matrix products use too), and OpenMP
// waits passively when several workers share the machine, because spinning
// threads of one worker steal the cores of the others (measured 3-5x slower).

#include <cstdint>
#include <map>
#include <string>

namespace fulgur::runtime {

// Cores this process may run on (its CPU affinity).
int64_t available_cores();

// Threads a worker gets when `local_world_size` workers share this machine.
int64_t threads_per_worker(int64_t local_world_size);

// Environment a freshly started worker needs so OpenMP sizes its pool right
// at load time.
std::map<std::string, std::string> thread_environment(int64_t local_world_size);

// Applies the policy to this (already running) process.
void apply_thread_policy(int64_t local_world_size);

}  // namespace fulgur::runtime
