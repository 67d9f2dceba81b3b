// SPDX-License-Identifier: Apache-2.0
#pragma once
// hparams.yaml, as Lightning's CSVLogger and TensorBoardLogger write it in
// their version folder: the module's hparams as a YAML mapping that
// yaml.safe_load reads back to the same values.

#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>

#include <string>

namespace fulgur::detail {

// The YAML text of `hparams` ("{}" when empty). Nested dicts become nested
// mappings, lists and tuples block sequences; ints, floats (inf and nan as
// .inf and .nan), bools and None (null) are plain; a string is plain only when
// it cannot read as anything but itself (letters, digits, _ . - /, not
// starting with a digit, not a YAML 1.1 bool or null word), otherwise double
// quoted with escapes (UTF-8 passes through). Any other value (a tensor, an
// object) is written as the quoted text of the IValue, as the TensorBoard
// hparams are.
std::string hparams_yaml(const c10::Dict<std::string, c10::IValue>& hparams);

// Writes hparams_yaml(hparams) to <dir>/hparams.yaml, creating `dir`; throws
// std::runtime_error naming the file if it cannot be written.
void write_hparams_yaml(const std::string& dir, const c10::Dict<std::string, c10::IValue>& hparams);

}  // namespace fulgur::detail
