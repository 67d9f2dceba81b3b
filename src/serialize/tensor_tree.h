// SPDX-License-Identifier: Apache-2.0
#pragma once
// An IValue as a tree: dicts, lists and tuples inside one another, with
// tensors (and other values) at the leaves.

#include <ATen/core/Dict.h>
#include <ATen/core/List.h>
#include <ATen/core/ivalue.h>

#include <utility>
#include <vector>

namespace fulgur::detail {

// `value` with every tensor inside it (dicts, lists, tuples, nested) replaced
// by f(tensor), visited depth first in container order; other leaves are
// kept. Containers are new; keys and element types are kept.
template <typename F>
c10::IValue map_tensors(const c10::IValue& value, F&& f) {
  if (value.isTensor()) return f(value.toTensor());
  if (value.isGenericDict()) {
    auto in = value.toGenericDict();
    c10::impl::GenericDict out(in.keyType(), in.valueType());
    for (const auto& kv : in) out.insert(kv.key(), map_tensors(kv.value(), f));
    return out;
  }
  if (value.isList()) {
    auto in = value.toList();
    c10::impl::GenericList out(in.elementType());
    for (const auto& v : in) out.push_back(map_tensors(v, f));
    return out;
  }
  if (value.isTuple()) {
    std::vector<c10::IValue> items;
    for (const auto& v : value.toTupleRef().elements()) items.push_back(map_tensors(v, f));
    return c10::ivalue::Tuple::create(std::move(items));
  }
  return value;
}

}  // namespace fulgur::detail
