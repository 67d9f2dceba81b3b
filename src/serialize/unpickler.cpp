// SPDX-License-Identifier: Apache-2.0
// The restricted unpickler's opcodes (pickle_parser.h), and its entry point.

#include "serialize/pickle_parser.h"

#include <cstdio>

namespace fulgur::detail::pickle {

uint32_t Parser::parse() {
  while (true) {
    op_at_ = pos_;
    need(1);
    const uint8_t op = p_[pos_++];
    switch (op) {
      case 0x80: {  // PROTO
        const uint64_t v = le(1);
        if (v > 5) fail("pickle protocol " + std::to_string(v) + " (this reader knows 0 to 5)");
        break;
      }
      case 0x95: le(8); break;  // FRAME: a length hint
      case '.': {               // STOP
        if (!marks_.empty()) fail("STOP inside a MARK");
        if (stack_.size() != 1) fail("STOP with " + std::to_string(stack_.size()) + " values on the stack, not 1");
        return stack_.back();
      }
      case '(': marks_.push_back(stack_.size()); break;
      case '0': pop(); break;                                 // POP
      case '1': pop_mark(); break;                            // POP_MARK
      case '2': stack_.push_back(top()); break;               // DUP
      case 'N': stack_.push_back(make(Node{})); break;        // NONE
      case 0x88: stack_.push_back(make_int(Kind::kBool, 1)); break;
      case 0x89: stack_.push_back(make_int(Kind::kBool, 0)); break;
      case 'J': stack_.push_back(make_int(Kind::kInt, static_cast<int32_t>(static_cast<uint32_t>(le(4))))); break;
      case 'K': stack_.push_back(make_int(Kind::kInt, static_cast<int64_t>(le(1)))); break;
      case 'M': stack_.push_back(make_int(Kind::kInt, static_cast<int64_t>(le(2)))); break;
      case 0x8a: case 0x8b: {  // LONG1, LONG4
        const uint64_t k = op == 0x8a ? le(1) : le(4);
        if (k > 8) fail("an integer of " + std::to_string(k) + " bytes (at most 8 fit in int64)");
        need(static_cast<size_t>(k));
        uint64_t v = 0;
        for (uint64_t b = k; b-- > 0;) v = (v << 8) | p_[pos_ + b];
        if (k > 0 && k < 8 && (p_[pos_ + k - 1] & 0x80)) v |= ~uint64_t(0) << (8 * k);  // sign-extend
        pos_ += static_cast<size_t>(k);
        stack_.push_back(make_int(Kind::kInt, static_cast<int64_t>(v)));
        break;
      }
      case 'G': {  // BINFLOAT, big-endian
        need(8);
        uint64_t bits = 0;
        for (int b = 0; b < 8; ++b) bits = (bits << 8) | p_[pos_ + static_cast<size_t>(b)];
        pos_ += 8;
        Node node;
        node.kind = Kind::kFloat;
        std::memcpy(&node.f, &bits, 8);
        stack_.push_back(make(std::move(node)));
        break;
      }
      case 'X': case 'T': case 'B': stack_.push_back(make_str(bytes(le(4)))); break;  // BINUNICODE, BINSTRING, BINBYTES
      case 0x8c: case 'U': case 'C': stack_.push_back(make_str(bytes(le(1)))); break;  // short forms
      case 0x8d: case 0x8e: stack_.push_back(make_str(bytes(le(8)))); break;           // 8-byte lengths
      case 'q': memo_put(le(1)); break;   // BINPUT
      case 'r': memo_put(le(4)); break;   // LONG_BINPUT
      case 0x94: memo_put(memo_.size()); break;  // MEMOIZE
      case 'h': memo_get(le(1)); break;   // BINGET
      case 'j': memo_get(le(4)); break;   // LONG_BINGET
      case ']': stack_.push_back(make_container(Kind::kList)); break;
      case ')': stack_.push_back(make_container(Kind::kTuple)); break;
      case '}': stack_.push_back(make_container(Kind::kDict)); break;
      case 'l': stack_.push_back(make_container(Kind::kList, pop_mark())); break;
      case 't': stack_.push_back(make_container(Kind::kTuple, pop_mark())); break;
      case 0x85: case 0x86: case 0x87: {  // TUPLE1..3
        const size_t k = op - 0x84u;
        std::vector<uint32_t> items(k);
        for (size_t j = k; j-- > 0;) items[j] = pop();
        stack_.push_back(make_container(Kind::kTuple, std::move(items)));
        break;
      }
      case 'd': {  // DICT
        auto items = pop_mark();
        if (items.size() % 2) fail("DICT with an odd number of items");
        stack_.push_back(make_container(Kind::kDict, std::move(items)));
        break;
      }
      case 'a': {  // APPEND
        const uint32_t v = pop();
        expect(top(), Kind::kList, "APPEND's target").items.push_back(v);
        break;
      }
      case 'e': {  // APPENDS
        auto items = pop_mark();
        auto& list = expect(top(), Kind::kList, "APPENDS' target").items;
        list.insert(list.end(), items.begin(), items.end());
        break;
      }
      case 's': {  // SETITEM
        const uint32_t v = pop();
        const uint32_t k = pop();
        auto& d = expect(top(), Kind::kDict, "SETITEM's target").items;
        d.push_back(k);
        d.push_back(v);
        break;
      }
      case 'u': {  // SETITEMS
        auto items = pop_mark();
        if (items.size() % 2) fail("SETITEMS with an odd number of items");
        auto& d = expect(top(), Kind::kDict, "SETITEMS' target").items;
        d.insert(d.end(), items.begin(), items.end());
        break;
      }
      case 'c': {  // GLOBAL
        std::string module = line();
        std::string name = line();
        stack_.push_back(global(module + "." + name));
        break;
      }
      case 0x93: {  // STACK_GLOBAL
        const uint32_t name = pop();
        const uint32_t module = pop();
        const std::string m = expect(module, Kind::kStr, "STACK_GLOBAL's module").s;
        const std::string q = m + "." + expect(name, Kind::kStr, "STACK_GLOBAL's name").s;
        stack_.push_back(global(q));
        break;
      }
      case 'R': {  // REDUCE
        const uint32_t args = pop();
        const uint32_t fn = pop();
        stack_.push_back(reduce(fn, args));
        break;
      }
      case 0x81: {  // NEWOBJ
        const uint32_t args = pop();
        const uint32_t cls = pop();
        const std::string& g = expect(cls, Kind::kGlobal, "NEWOBJ's class").s;
        if (!is_dict_class(g)) fail("NEWOBJ of '" + g + "': only dict classes are rebuilt");
        if (!expect(args, Kind::kTuple, "NEWOBJ's arguments").items.empty()) fail("'" + g + "' built with arguments");
        stack_.push_back(make_container(Kind::kDict));
        break;
      }
      case 'b': {  // BUILD: only the attribute state of an OrderedDict (its _metadata), which is dropped
        pop();
        const Node& target = nodes_[top()];
        if (target.kind != Kind::kDict) fail(std::string("BUILD on a ") + kind_name(target.kind) + ": only dicts take attribute state");
        break;
      }
      case 'Q': {  // BINPERSID
        const uint32_t pid = pop();
        stack_.push_back(storage(pid));
        break;
      }
      default: {
        char hex[8];
        std::snprintf(hex, sizeof hex, "0x%02x", op);
        fail(std::string("opcode ") + hex + " is not one this reader takes");
      }
    }
  }
}

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::kNone: return "None";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kStr: return "str";
    case Kind::kList: return "list";
    case Kind::kTuple: return "tuple";
    case Kind::kDict: return "dict";
    case Kind::kTensor: return "tensor";
    case Kind::kStorage: return "storage";
    case Kind::kGlobal: return "global";
  }
  return "?";
}

Parsed parse_pickle(const uint8_t* data, size_t size, const ZipArchive& zip, const std::string& prefix,
                    const ReadLimits& limits) {
  return Parser(data, size, zip, prefix, limits).run();
}

}  // namespace fulgur::detail::pickle
