// SPDX-License-Identifier: Apache-2.0
#include "runtime/memory.h"

#include "runtime/env.h"

#include <malloc.h>

#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <string>

namespace fulgur::runtime {

namespace {

void decide_and_apply() {
  const std::string choice = env_string("FULGUR_MALLOC_POLICY");
  if (choice == "off" || choice == "0") return;
  const std::string error = environment_value_error(environment_variable("FULGUR_MALLOC_POLICY"), choice);
  if (!error.empty()) throw std::invalid_argument(error);
  // The user's own settings win.
  if (env_set("MALLOC_MMAP_THRESHOLD_") || env_set("MALLOC_TRIM_THRESHOLD_") || env_set("MALLOC_TOP_PAD_")) return;
  if (env_string("GLIBC_TUNABLES").find("glibc.malloc.") != std::string::npos) return;
  mallopt(M_MMAP_THRESHOLD, static_cast<int>(kMmapThreshold));
  mallopt(M_TRIM_THRESHOLD, static_cast<int>(kTrimThreshold));
  mallopt(M_TOP_PAD, static_cast<int>(kTopPad));
}

}  // namespace

void apply_malloc_policy() {
  static std::once_flag once;
  std::call_once(once, decide_and_apply);
}

}  // namespace fulgur::runtime
