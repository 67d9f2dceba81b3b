// SPDX-License-Identifier: Apache-2.0
#pragma once
// fulgur's version (semantic versioning; CHANGELOG.md says what changed). CMake reads the
// project's version from these lines, so they are the one place it is written.

#include <string>

#define FULGUR_VERSION_MAJOR 0
#define FULGUR_VERSION_MINOR 1
#define FULGUR_VERSION_PATCH 0

// The format of the checkpoints this fulgur writes ("fulgur_format_version"); it reads this one
// and older ones, and refuses a newer one naming both versions.
#define FULGUR_CHECKPOINT_FORMAT_VERSION 1

namespace fulgur {

// "MAJOR.MINOR.PATCH" of the headers a program was compiled with.
inline std::string version() {
  return std::to_string(FULGUR_VERSION_MAJOR) + "." + std::to_string(FULGUR_VERSION_MINOR) + "." +
         std::to_string(FULGUR_VERSION_PATCH);
}

}  // namespace fulgur
