// SPDX-License-Identifier: Apache-2.0
// The restricted reader's values as IValues (pickle.h): TorchScript's type tags give containers
// their element types, as torch::pickle_load does; untagged dicts get str or int keys (whichever
// all keys are) and untagged lists the element type all their elements share.

#include "serialize/pickle.h"

#include "serialize/torch_archive.h"

#include <ATen/core/Dict.h>
#include <ATen/core/List.h>
#include <ATen/core/jit_type.h>

#include <cctype>
#include <optional>
#include <vector>

namespace fulgur::detail::pickle {
namespace {

class Converter {
 public:
  Converter(const std::vector<Node>& nodes, std::string where, const ReadLimits& limits)
      : nodes_(nodes), where_(std::move(where)), limits_(limits), converted_(nodes.size()), state_(nodes.size(), 0) {}

  c10::IValue run(uint32_t top) { return convert(top, 0); }

 private:
  [[noreturn]] void fail_value(const std::string& what) const {
    throw SerializationError(where_ + ": " + what);
  }

  // A tiny parser for the type tags TorchScript writes: int, float, str, bool,
  // Tensor, Any, NoneType, List[T], Dict[K, V], Optional[T], Tuple[T, ...].
  c10::TypePtr parse_type(const std::string& s, size_t& at, int depth) const {
    if (depth > 32) fail_value("type tag '" + s + "' nests too deeply");
    auto skip = [&] {
      while (at < s.size() && s[at] == ' ') ++at;
    };
    skip();
    size_t start = at;
    while (at < s.size() && (std::isalnum(static_cast<unsigned char>(s[at])) || s[at] == '_')) ++at;
    const std::string word = s.substr(start, at - start);
    auto args = [&](size_t count) {
      std::vector<c10::TypePtr> out;
      skip();
      if (at >= s.size() || s[at] != '[') fail_value("type tag '" + s + "': '" + word + "' without '['");
      ++at;
      while (true) {
        out.push_back(parse_type(s, at, depth + 1));
        skip();
        if (at < s.size() && s[at] == ',') {
          ++at;
          continue;
        }
        if (at < s.size() && s[at] == ']') {
          ++at;
          break;
        }
        fail_value("type tag '" + s + "' is malformed");
      }
      if (count && out.size() != count) fail_value("type tag '" + s + "': '" + word + "' takes " + std::to_string(count));
      return out;
    };
    if (word == "int") return c10::IntType::get();
    if (word == "float") return c10::FloatType::get();
    if (word == "str") return c10::StringType::get();
    if (word == "bool") return c10::BoolType::get();
    if (word == "Tensor") return c10::TensorType::get();
    if (word == "Any") return c10::AnyType::get();
    if (word == "NoneType") return c10::NoneType::get();
    if (word == "List") return c10::ListType::create(args(1)[0]);
    if (word == "Optional") return c10::OptionalType::create(args(1)[0]);
    if (word == "Tuple") return c10::TupleType::create(args(0));
    if (word == "Dict") {
      const auto kv = args(2);
      if (kv[0] != c10::StringType::get() && kv[0] != c10::IntType::get()) fail_value("type tag '" + s + "': dict keys must be str or int");
      return c10::DictType::create(kv[0], kv[1]);
    }
    fail_value("type tag '" + s + "' names a type this reader does not know ('" + word + "')");
  }

  c10::TypePtr tag_type(const std::string& tag) const {
    size_t at = 0;
    c10::TypePtr t = parse_type(tag, at, 0);
    if (at != tag.size()) fail_value("type tag '" + tag + "' has trailing characters");
    return t;
  }

  static c10::TypePtr scalar_type_of(const Node& n) {
    switch (n.kind) {
      case Kind::kBool: return c10::BoolType::get();
      case Kind::kInt: return c10::IntType::get();
      case Kind::kFloat: return c10::FloatType::get();
      case Kind::kStr: return c10::StringType::get();
      case Kind::kTensor: return c10::TensorType::get();
      default: return nullptr;
    }
  }

  void check_type(const c10::IValue& v, const c10::TypePtr& t, const std::string& tag) const {
    if (t->kind() == c10::TypeKind::AnyType) return;
    if (!v.type()->isSubtypeOf(*t)) {
      fail_value("a container tagged '" + tag + "' holds a " + v.type()->repr_str() + ", not a " + t->repr_str());
    }
  }

  // A list's elements; `tag` is its type tag ("" when Python wrote it).
  c10::IValue convert_list(const std::vector<uint32_t>& items, const std::string& tag, int depth) {
    c10::TypePtr elem;
    if (!tag.empty()) {
      const c10::TypePtr t = tag_type(tag);
      if (t->kind() != c10::TypeKind::ListType) fail_value("a list tagged '" + tag + "'");
      elem = t->castRaw<c10::ListType>()->getElementType();
    } else {
      // Untagged (Python wrote it): the element type all elements share, else Any.
      for (uint32_t v : items) {
        const c10::TypePtr t = scalar_type_of(nodes_[v]);
        if (!t || (elem && *t != *elem)) {
          elem = nullptr;
          break;
        }
        elem = t;
      }
      if (!elem) elem = c10::AnyType::get();
    }
    c10::impl::GenericList list(elem);
    list.reserve(items.size());
    for (uint32_t v : items) {
      c10::IValue e = convert(v, depth + 1);
      check_type(e, elem, tag.empty() ? "List" : tag);
      list.push_back(std::move(e));
    }
    return c10::IValue(list);
  }

  // A dict's keys and values, alternating in `items`; `tag` as for a list.
  c10::IValue convert_dict(const std::vector<uint32_t>& items, const std::string& tag, int depth) {
    c10::TypePtr key_type, value_type = c10::AnyType::get();
    if (!tag.empty()) {
      const c10::TypePtr t = tag_type(tag);
      if (t->kind() != c10::TypeKind::DictType) fail_value("a dict tagged '" + tag + "'");
      key_type = t->castRaw<c10::DictType>()->getKeyType();
      value_type = t->castRaw<c10::DictType>()->getValueType();
    } else {
      for (size_t k = 0; k < items.size(); k += 2) {
        const Kind kk = nodes_[items[k]].kind;
        if (kk != Kind::kStr && kk != Kind::kInt) fail_value(std::string("a dict key that is a ") + kind_name(kk) + " (only str and int keys are read)");
        const c10::TypePtr t = scalar_type_of(nodes_[items[k]]);
        if (key_type && *t != *key_type) fail_value("a dict whose keys are both str and int");
        key_type = t;
      }
      if (!key_type) key_type = c10::StringType::get();
    }
    c10::impl::GenericDict dict(key_type, value_type);
    dict.reserve(items.size() / 2);
    for (size_t k = 0; k < items.size(); k += 2) {
      c10::IValue key = convert(items[k], depth + 1);
      check_type(key, key_type, tag.empty() ? "Dict" : tag);
      c10::IValue value = convert(items[k + 1], depth + 1);
      check_type(value, value_type, tag.empty() ? "Dict" : tag);
      dict.insert_or_assign(std::move(key), std::move(value));
    }
    return c10::IValue(dict);
  }

  c10::IValue convert(uint32_t id, int depth) {
    if (depth > limits_.max_depth) {
      fail_value("containers nest deeper than " + std::to_string(limits_.max_depth) + " (ReadLimits::max_depth)");
    }
    const Node& n = nodes_[id];
    switch (n.kind) {
      case Kind::kNone: return c10::IValue();
      case Kind::kBool: return c10::IValue(n.i != 0);
      case Kind::kInt: return c10::IValue(n.i);
      case Kind::kFloat: return c10::IValue(n.f);
      case Kind::kStr: return c10::IValue(n.s);
      case Kind::kTensor: return c10::IValue(n.t);
      case Kind::kStorage: fail_value("a bare storage is not a value this reader returns");
      case Kind::kGlobal: fail_value("the global '" + n.s + "' is not a value this reader returns");
      default: break;
    }
    if (converted_[id]) return *converted_[id];
    if (state_[id] == 1) fail_value("a " + std::string(kind_name(n.kind)) + " contains itself");
    state_[id] = 1;
    // Conversion adds no nodes, so these references stay valid.
    const std::vector<uint32_t>& items = n.items;
    const std::string& tag = n.s;
    const Kind kind = n.kind;
    c10::IValue out;
    if (kind == Kind::kTuple) {
      std::vector<c10::IValue> elems;
      elems.reserve(items.size());
      for (uint32_t v : items) elems.push_back(convert(v, depth + 1));
      out = c10::ivalue::Tuple::create(std::move(elems));
    } else if (kind == Kind::kList) {
      out = convert_list(items, tag, depth);
    } else {  // kDict
      out = convert_dict(items, tag, depth);
    }
    state_[id] = 2;
    converted_[id] = out;
    return out;
  }

  const std::vector<Node>& nodes_;
  std::string where_;
  const ReadLimits& limits_;
  std::vector<std::optional<c10::IValue>> converted_;
  std::vector<uint8_t> state_;  // 0 not seen, 1 being converted, 2 done
};

}  // namespace

c10::IValue pickle_to_ivalue(const Parsed& parsed, const std::string& where, const ReadLimits& limits) {
  return Converter(parsed.nodes, where, limits).run(parsed.top);
}

}  // namespace fulgur::detail::pickle
