// SPDX-License-Identifier: Apache-2.0
#pragma once
// Shaping other libraries' messages into fulgur's one-line ones.

#include <string>

namespace fulgur::runtime {

// `s` up to its first newline (c10 appends a backtrace after it).
inline std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

}  // namespace fulgur::runtime
