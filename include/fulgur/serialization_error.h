// SPDX-License-Identifier: Apache-2.0
#pragma once
// The error of every reader of untrusted bytes: checkpoint files, state_dicts
// that Python saved, and objects broadcast by other ranks.

#include <stdexcept>
#include <string>

namespace fulgur {

// Thrown when bytes are not a well-formed torch archive, or hold something the
// restricted reader does not rebuild (a Python object other than a tensor,
// container, string or number), or exceed a read limit. what() names the
// source (the file, or the rank that sent the bytes), the place inside it
// (record, key or pickle offset) and what was expected.
class SerializationError : public std::runtime_error {
 public:
  explicit SerializationError(const std::string& what) : std::runtime_error(what) {}
};

}  // namespace fulgur
