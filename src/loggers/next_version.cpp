// SPDX-License-Identifier: Apache-2.0
#include "loggers/next_version.h"

#include <algorithm>
#include <filesystem>

namespace fs = std::filesystem;

namespace fulgur::detail {

int64_t next_version(const std::string& dir) {
  int64_t next = 0;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return next;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (n.rfind("version_", 0) != 0) continue;
    try {
      next = std::max<int64_t>(next, std::stoll(n.substr(8)) + 1);
    } catch (...) {
    }
  }
  return next;
}

}  // namespace fulgur::detail
