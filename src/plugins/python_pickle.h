#pragma once
// Reading what Python's torch.save wrote for a state_dict.

#include <ATen/core/ivalue.h>

#include <vector>

namespace fulgur::detail {

// libtorch's unpickler turns every collections.OrderedDict into None (it only
// expects them as the unused hooks argument of a tensor), so a state_dict
// that Python saved with torch.save (an OrderedDict with a _metadata
// attribute) does not load with torch::pickle_load. This reads the zip
// archive, rewrites the pickle so that each OrderedDict is a plain dict (and
// drops the attribute state given to them), then unpickles it with its
// tensors. Nothing in the pickle is executed: only the opcodes libtorch's
// unpickler accepts are passed on. Throws std::runtime_error when the bytes
// are not such an archive or hold opcodes this rewrite does not know.
c10::IValue load_python_pickle(const std::vector<char>& bytes);

}  // namespace fulgur::detail
