#include "runtime/memory.h"

#include <malloc.h>

#include <cstdlib>
#include <mutex>
#include <stdexcept>

namespace fulgur::runtime {

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

MallocPolicy decide_and_apply() {
  const std::string choice = env("FULGUR_MALLOC_POLICY");
  if (choice == "off" || choice == "0") return {false, "FULGUR_MALLOC_POLICY=" + choice};
  if (!choice.empty() && choice != "on" && choice != "1")
    throw std::invalid_argument("FULGUR_MALLOC_POLICY=" + choice + ": allowed values are on, 1, off, 0");
  for (const char* name : {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"})
    if (!env(name).empty()) return {false, std::string(name) + " is set"};
  if (env("GLIBC_TUNABLES").find("glibc.malloc.") != std::string::npos) return {false, "GLIBC_TUNABLES sets malloc"};
  if (mallopt(M_MMAP_THRESHOLD, static_cast<int>(kMmapThreshold)) != 1)
    return {false, "mallopt(M_MMAP_THRESHOLD) refused"};
  if (mallopt(M_TRIM_THRESHOLD, static_cast<int>(kTrimThreshold)) != 1)
    return {false, "mallopt(M_TRIM_THRESHOLD) refused"};
  return {true, ""};
}

}  // namespace

MallocPolicy apply_malloc_policy() {
  static std::once_flag once;
  static MallocPolicy result;
  std::call_once(once, [] { result = decide_and_apply(); });
  return result;
}

}  // namespace fulgur::runtime
