// SPDX-License-Identifier: Apache-2.0
#pragma once
// The environment variables fulgur reads, for a program's --help.

#include <string>
#include <vector>

namespace fulgur {

// Lines "  NAME  what it does (unset: ...)" for each of `names`, from fulgur's table of the
// variables it honours (the README lists them all). Throws std::invalid_argument naming a
// name fulgur does not read.
// Example: app.footer("Environment:\n" + fulgur::environment_help({"PJRT_DEVICE", "XLA_NUM_DEVICES"}));
std::string environment_help(const std::vector<std::string>& names);

}  // namespace fulgur
