#include "runtime/threads.h"

#include "runtime/log.h"

#include <ATen/Parallel.h>

#include <dlfcn.h>
#include <strings.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <optional>
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
  std::map<std::string, std::string> env{{"OMP_NUM_THREADS", n}, {"OPENBLAS_NUM_THREADS", n}};
  if (local_world_size > 1) env["OMP_WAIT_POLICY"] = "PASSIVE";
  return env;
}

void apply_thread_policy(int64_t local_world_size) {
  const int n = static_cast<int>(threads_per_worker(local_world_size));
  at::set_num_threads(n);
  // OpenBLAS keeps a pool of its own; size it too when it is the BLAS in use.
  using SetThreads = void (*)(int);
  if (auto fn = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) fn(n);
}

void warn_if_blas_kernels_are_generic() {
  static std::atomic<bool> warned{false};
  using CoreName = char* (*)();
  auto core_name = reinterpret_cast<CoreName>(dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  if (!core_name || warned.exchange(true)) return;
  const char* core = core_name();
  if (!core || strcasecmp(core, "prescott") != 0) return;
  struct Better { const char* isa; const char* core; };
  const std::optional<Better> better = __builtin_cpu_supports("avx512f") ? Better{"AVX-512", "SkylakeX"}
                                       : __builtin_cpu_supports("avx2") ? Better{"AVX2", "Haswell"}
                                                                        : std::optional<Better>();
  if (!better) return;  // an old CPU: SSE3 is what it has
  log_rank_zero(LogLevel::kWarning,
                std::string("OpenBLAS runs its generic Prescott (SSE3) kernels on this CPU, which has ") + better->isa +
                    ": it did not recognise the CPU model, and matrix products run several times slower. Start "
                    "the program with OPENBLAS_CORETYPE=" + better->core +
                    " in its environment (OpenBLAS chooses when it loads, before fulgur can)");
}

}  // namespace fulgur::runtime
