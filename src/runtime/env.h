// SPDX-License-Identifier: Apache-2.0
#pragma once
// Reading the process environment, in one place: unset and empty count the
// same, and a malformed number is an error naming the variable. Every name
// read here must be in the table of runtime/env_vars.h (std::logic_error
// otherwise), which documents it and checks its value when a Trainer is made.

#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "runtime/env_vars.h"

namespace fulgur::runtime {

// The value of `name`, or nullptr when it is unset or empty.
inline const char* env_value(const char* name) {
  environment_variable(name);  // throws for a name the table does not list
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

// Whether `name` is set to a non-empty value.
inline bool env_set(const char* name) { return env_value(name) != nullptr; }

// The value of `name`, or "" when it is unset.
inline std::string env_string(const char* name) {
  const char* v = env_value(name);
  return v ? v : "";
}

// The value of `name`, which `who` needs; throws std::runtime_error naming
// both when it is unset or empty.
inline std::string env_required(const char* name, const std::string& who) {
  const char* v = env_value(name);
  if (!v) throw std::runtime_error(who + " needs the environment variable " + name + ", which is not set");
  return v;
}

// The value of `name` as a non-negative integer, or `fallback` when it is
// unset or empty; throws std::invalid_argument naming it otherwise.
inline int64_t env_int(const char* name, int64_t fallback) {
  const char* v = env_value(name);
  if (!v) return fallback;
  char* end = nullptr;
  const long long n = std::strtoll(v, &end, 10);
  if (*end != '\0' || n < 0) {
    throw std::invalid_argument(std::string("environment variable ") + name + "='" + v +
                                "' must be a non-negative integer");
  }
  return n;
}

// The value of `name` as a TCP port, or `fallback` when it is unset or empty;
// throws std::invalid_argument naming it when it is not in [0, 65535].
inline int env_port(const char* name, int fallback) {
  const int64_t port = env_int(name, fallback);
  if (port > 65535) {
    throw std::invalid_argument(std::string("environment variable ") + name + "=" + std::to_string(port) +
                                " is not a TCP port; use a value in [1, 65535]");
  }
  return static_cast<int>(port);
}

}  // namespace fulgur::runtime
