// SPDX-License-Identifier: Apache-2.0
#pragma once
// Lightning's version numbering of a logger's runs: <dir>/version_<N>.

#include <cstdint>
#include <string>

namespace fulgur::detail {

// One more than the largest N of the version_<N> folders in `dir` (0 when
// there is none, or no `dir`).
int64_t next_version(const std::string& dir);

}  // namespace fulgur::detail
