// SPDX-License-Identifier: Apache-2.0
#pragma once
// The two halves of the restricted torch archive reader (torch_archive.h), on each side of one
// plain data structure: the values a pickle builds, before they become IValues. They live in one
// arena and refer to each other by index, so that nothing recurses or frees recursively, whatever
// the bytes nest or share.
//   parse_pickle (pickle_parser.h, unpickler.cpp, pickle_callables.cpp): runs the pickle's
//     opcodes, refusing any global but the known tensor, container and type-tag callables, and
//     reads each storage from its zip record;
//   pickle_to_ivalue (pickle_convert.cpp): turns the values into IValues, typed by TorchScript's
//     type tags where the pickle has them.

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "serialize/limits.h"

namespace fulgur::detail {

class ZipArchive;

namespace pickle {

enum class Kind : uint8_t { kNone, kBool, kInt, kFloat, kStr, kList, kTuple, kDict, kTensor, kStorage, kGlobal };

// "None", "bool", ..., as the errors name a kind.
const char* kind_name(Kind k);

struct Node {
  Kind kind = Kind::kNone;
  int64_t i = 0;                // kBool, kInt
  double f = 0;                 // kFloat
  std::string s;                // kStr; kGlobal: "module.name"; kList/kDict: the type tag
  std::vector<uint32_t> items;  // kList, kTuple; kDict: key, value, key, value...
  at::Tensor t;                 // kTensor; kStorage: the whole storage as a 1-d tensor
};

// A parsed pickle: its values and the one STOP left on the stack.
struct Parsed {
  std::vector<Node> nodes;
  uint32_t top = 0;
};

// Runs the pickle `data[0, size)`, the record "<prefix>/data.pkl" of `zip`, whose storages are
// the records "<prefix>/data/<key>". Throws SerializationError "<source>: <prefix>/data.pkl at
// byte <offset>: <what>" for anything it refuses.
Parsed parse_pickle(const uint8_t* data, size_t size, const ZipArchive& zip, const std::string& prefix,
                    const ReadLimits& limits);

// The IValue of `parsed`. `where` names the pickle in errors (SerializationError "<where>:
// <what>": a container that contains itself, a type tag it does not know, a bare storage).
c10::IValue pickle_to_ivalue(const Parsed& parsed, const std::string& where, const ReadLimits& limits);

}  // namespace pickle
}  // namespace fulgur::detail
