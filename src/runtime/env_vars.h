// SPDX-License-Identifier: Apache-2.0
#pragma once
// Every environment variable fulgur honours, in one table (as torch_xla's
// env_vars.h): its name, the values it may hold, what unset means, and one
// line of documentation. runtime/env.h reads variables only by a name the
// table lists; the Trainer's constructor checks every set variable against it
// (validate_environment), so a malformed value is an error before any process
// starts, wherever the variable is read later. The README's list is
// environment_table_markdown(); a test keeps the two equal.

#include <string>
#include <vector>

namespace fulgur::runtime {

// What a variable's value must look like.
enum class EnvFormat {
  kText,          // anything (a path, an address, flags for another program)
  kCount,         // an integer >= 0
  kPositive,      // an integer >= 1
  kPort,          // an integer in [0, 65535]
  kChoice,        // one of the words in `choices`
  kThreadCounts,  // integers >= 1 separated by commas (OpenMP's nested levels)
  kEndsInDigits,  // text whose last character is a digit (SLURM_JOB_ID)
};

struct EnvVar {
  const char* name;
  EnvFormat format;
  // kChoice: the words allowed, separated by '|'.
  const char* choices;
  // The allowed values in words, for the error and the README.
  const char* allowed;
  // What unset (or empty) means.
  const char* unset;
  // One line: what fulgur does with it.
  const char* doc;
};

// The table, in the order the README lists it.
const std::vector<EnvVar>& environment_variables();

// The row of `name`. Throws std::logic_error when the table does not list it:
// fulgur reads no variable the table does not document.
const EnvVar& environment_variable(const char* name);

// Checks the value of every set, non-empty variable of the table; throws
// std::invalid_argument for the first malformed one, naming it, its value and
// what is allowed ("NAME='value' is not valid: <allowed>"). The Trainer's
// constructor calls it.
void validate_environment();

// Checks one value against one row's format; "" when it is valid, else the
// error validate_environment would throw.
std::string environment_value_error(const EnvVar& var, const std::string& value);

// The README's table of the variables (Markdown, one row per variable).
std::string environment_table_markdown();

}  // namespace fulgur::runtime
