// SPDX-License-Identifier: Apache-2.0
#pragma once
// The one reader of untrusted torch archives: checkpoint files, state_dicts
// that Python's torch.save wrote, and objects broadcast by other ranks.
//
// It is in the spirit of Python's torch.load(weights_only=True): the zip is
// parsed with bounds checks and CRC32 verification (zip_reader.h), and the
// pickle is read by a restricted unpickler of our own that builds only None,
// bools, ints, floats, strings (bytes become strings), lists, tuples, dicts
// (collections.OrderedDict and Lightning's AttributeDict become plain dicts,
// attribute state given to them is dropped) and tensors, rebuilt only through
// torch._utils._rebuild_tensor_v2 / _rebuild_tensor / _rebuild_parameter, with
// dtype, sizes, strides and offset checked against the length of the record
// before any tensor exists. No other global is looked up, nothing is called,
// and libtorch's own unpickler never sees the bytes. TorchScript's type tags
// (torch.jit._pickle.restore_type_tag, build_intlist, ...) give containers
// their element types, as torch::pickle_load does; untagged dicts get str or
// int keys (whichever all keys are) and untagged lists the element type all
// their elements share.

#include "serialize/limits.h"

#include <ATen/core/ivalue.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace fulgur::detail {

// REQUIRES: `data` holds the whole archive. `source` names it in errors.
// Tensors are CPU tensors whatever device they were saved from; tensors that
// shared a storage when saved share one again. Throws SerializationError.
c10::IValue load_torch_archive(const uint8_t* data, size_t size, const std::string& source,
                               const ReadLimits& limits = {});

// `value` as a Dict[str, Any] (what checkpoints, state_dicts and their
// sub-dicts are read as). Throws SerializationError "<what> is a <type>, not
// a dict with string keys" for anything else.
c10::Dict<std::string, c10::IValue> as_str_dict(const c10::IValue& value, const std::string& what);

}  // namespace fulgur::detail
