// SPDX-License-Identifier: Apache-2.0
// The restricted unpickler's opcodes and callables (pickle.h). Long because the opcodes and the
// few callables they may call (tensor and storage rebuilds, type tags) share one stack, memo and
// arena: every opcode and record the reader accepts is bounds-checked here.

#include "serialize/pickle.h"

#include "serialize/torch_archive.h"
#include "serialize/zip_reader.h"

#include <ATen/ATen.h>

#include <cstdio>
#include <cstring>
#include <unordered_map>
#include <vector>

namespace fulgur::detail::pickle {
namespace {

struct StorageType {
  const char* name;
  at::ScalarType dtype;
};
constexpr StorageType kStorageTypes[] = {
    {"torch.FloatStorage", at::kFloat},   {"torch.DoubleStorage", at::kDouble},
    {"torch.HalfStorage", at::kHalf},     {"torch.BFloat16Storage", at::kBFloat16},
    {"torch.LongStorage", at::kLong},     {"torch.IntStorage", at::kInt},
    {"torch.ShortStorage", at::kShort},   {"torch.CharStorage", at::kChar},
    {"torch.ByteStorage", at::kByte},     {"torch.BoolStorage", at::kBool},
    {"torch.ComplexFloatStorage", at::kComplexFloat}, {"torch.ComplexDoubleStorage", at::kComplexDouble},
};

// The globals this reader knows; any other is refused where it appears.
const char* const kCallables[] = {
    "torch._utils._rebuild_tensor_v2",
    "torch._utils._rebuild_tensor",
    "torch._utils._rebuild_parameter",
    "collections.OrderedDict",
    "torch.jit._pickle.restore_type_tag",
    "torch.jit._pickle.build_intlist",
    "torch.jit._pickle.build_doublelist",
    "torch.jit._pickle.build_boollist",
    "torch.jit._pickle.build_tensorlist",
    // Lightning's hyper-parameter container, a dict subclass.
    "lightning.fabric.utilities.data.AttributeDict",
    "lightning_fabric.utilities.data.AttributeDict",
    "pytorch_lightning.utilities.parsing.AttributeDict",
};

bool is_dict_class(const std::string& g) { return g == "collections.OrderedDict" || g.find("AttributeDict") != std::string::npos; }


class Parser {
 public:
  Parser(const uint8_t* data, size_t size, const ZipArchive& zip, std::string prefix, const ReadLimits& limits)
      : p_(data), n_(size), zip_(zip), prefix_(std::move(prefix)), limits_(limits) {}

  Parsed run() {
    const uint32_t top = parse();
    return Parsed{std::move(nodes_), top};
  }

 private:
  // --- errors and reads -----------------------------------------------------
  [[noreturn]] void fail(const std::string& what) const {
    throw SerializationError(zip_.source() + ": " + prefix_ + "/data.pkl at byte " + std::to_string(op_at_) + ": " +
                             what);
  }
  void need(size_t k) const {
    if (k > n_ - pos_) fail("truncated (needs " + std::to_string(k) + " more bytes, " + std::to_string(n_ - pos_) + " left)");
  }
  uint64_t le(int k) {
    need(static_cast<size_t>(k));
    uint64_t v = 0;
    for (int i = k - 1; i >= 0; --i) v = (v << 8) | p_[pos_ + static_cast<size_t>(i)];
    pos_ += static_cast<size_t>(k);
    return v;
  }
  std::string bytes(uint64_t k) {
    if (k > n_ - pos_) fail("a string of " + std::to_string(k) + " bytes, only " + std::to_string(n_ - pos_) + " left");
    std::string s(reinterpret_cast<const char*>(p_ + pos_), static_cast<size_t>(k));
    pos_ += static_cast<size_t>(k);
    return s;
  }
  std::string line() {
    const void* nl = std::memchr(p_ + pos_, '\n', n_ - pos_);
    if (!nl) fail("unterminated line");
    const size_t len = static_cast<size_t>(static_cast<const uint8_t*>(nl) - (p_ + pos_));
    std::string s(reinterpret_cast<const char*>(p_ + pos_), len);
    pos_ += len + 1;
    return s;
  }

  // --- the arena and the stack ---------------------------------------------
  uint32_t make(Node node) {
    if (nodes_.size() >= limits_.max_values) {
      fail("more than " + std::to_string(limits_.max_values) + " values (ReadLimits::max_values)");
    }
    nodes_.push_back(std::move(node));
    return static_cast<uint32_t>(nodes_.size() - 1);
  }
  uint32_t make_int(Kind k, int64_t v) {
    Node node;
    node.kind = k;
    node.i = v;
    return make(std::move(node));
  }
  uint32_t make_str(std::string s) {
    Node node;
    node.kind = Kind::kStr;
    node.s = std::move(s);
    return make(std::move(node));
  }
  uint32_t make_container(Kind k, std::vector<uint32_t> items = {}) {
    Node node;
    node.kind = k;
    node.items = std::move(items);
    return make(std::move(node));
  }
  size_t floor() const { return marks_.empty() ? 0 : marks_.back(); }
  uint32_t pop() {
    if (stack_.size() <= floor()) fail("stack underflow");
    const uint32_t v = stack_.back();
    stack_.pop_back();
    return v;
  }
  uint32_t top() const {
    if (stack_.size() <= floor()) fail("stack underflow");
    return stack_.back();
  }
  std::vector<uint32_t> pop_mark() {
    if (marks_.empty()) fail("no MARK to pop to");
    const size_t m = marks_.back();
    marks_.pop_back();
    std::vector<uint32_t> items(stack_.begin() + static_cast<std::ptrdiff_t>(m), stack_.end());
    stack_.resize(m);
    return items;
  }
  Node& expect(uint32_t id, Kind k, const char* what) {
    Node& node = nodes_[id];
    if (node.kind != k) fail(std::string(what) + " must be a " + kind_name(k) + ", found a " + kind_name(node.kind));
    return node;
  }
  void memo_put(uint64_t slot) { memo_[slot] = top(); }
  void memo_get(uint64_t slot) {
    const auto it = memo_.find(slot);
    if (it == memo_.end()) fail("memo slot " + std::to_string(slot) + " was never set");
    stack_.push_back(it->second);
  }

  // --- the opcodes ------------------------------------------------------------
  uint32_t parse() {
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

  uint32_t global(const std::string& q) {
    bool known = false;
    for (const char* c : kCallables) known = known || q == c;
    for (const auto& s : kStorageTypes) known = known || q == s.name;
    if (!known) {
      fail("global '" + q + "' is refused: this reader rebuilds only tensors, containers, strings and numbers "
           "(as torch.load(weights_only=True) does), and runs no code");
    }
    Node node;
    node.kind = Kind::kGlobal;
    node.s = q;
    return make(std::move(node));
  }

  const std::vector<uint32_t>& tuple_args(uint32_t args, const std::string& fn, size_t lo, size_t hi) {
    const auto& items = expect(args, Kind::kTuple, ("the arguments of " + fn).c_str()).items;
    if (items.size() < lo || items.size() > hi) {
      fail(fn + " takes " + std::to_string(lo) + (lo == hi ? "" : " to " + std::to_string(hi)) + " arguments, got " +
           std::to_string(items.size()));
    }
    return items;
  }

  std::vector<int64_t> int_tuple(uint32_t id, const char* what) {
    const Node& node = nodes_[id];
    if (node.kind != Kind::kTuple && node.kind != Kind::kList) fail(std::string(what) + " must be a tuple of ints");
    if (node.items.size() > static_cast<size_t>(limits_.max_tensor_dims)) {
      fail(std::string(what) + " has " + std::to_string(node.items.size()) + " dimensions, above the limit of " +
           std::to_string(limits_.max_tensor_dims) + " (ReadLimits::max_tensor_dims)");
    }
    std::vector<int64_t> out;
    for (uint32_t v : node.items) out.push_back(expect(v, Kind::kInt, what).i);
    return out;
  }

  uint32_t reduce(uint32_t fn_id, uint32_t args) {
    const std::string fn = expect(fn_id, Kind::kGlobal, "REDUCE's callable").s;
    if (fn == "torch._utils._rebuild_tensor_v2" || fn == "torch._utils._rebuild_tensor") {
      const bool v2 = fn.back() == '2';
      const auto& a = tuple_args(args, fn, v2 ? 6 : 4, v2 ? 7 : 4);
      Node node;
      node.kind = Kind::kTensor;
      node.t = rebuild(a[0], a[1], a[2], a[3]);
      if (v2 && expect(a[4], Kind::kBool, "requires_grad").i) set_requires_grad(node.t);
      return make(std::move(node));
    }
    if (fn == "torch._utils._rebuild_parameter") {
      const auto& a = tuple_args(args, fn, 3, 3);
      Node node;
      node.kind = Kind::kTensor;
      node.t = expect(a[0], Kind::kTensor, "a parameter's data").t;
      if (expect(a[1], Kind::kBool, "requires_grad").i) set_requires_grad(node.t);
      return make(std::move(node));
    }
    if (fn == "collections.OrderedDict") {
      tuple_args(args, fn, 0, 0);
      return make_container(Kind::kDict);
    }
    if (fn == "torch.jit._pickle.restore_type_tag") {
      const auto& a = tuple_args(args, fn, 2, 2);
      const std::string tag = expect(a[1], Kind::kStr, "a type tag").s;
      Node& obj = nodes_[a[0]];
      if (obj.kind == Kind::kList || obj.kind == Kind::kDict) obj.s = tag;
      return a[0];
    }
    const char* tag = fn == "torch.jit._pickle.build_intlist"      ? "List[int]"
                      : fn == "torch.jit._pickle.build_doublelist" ? "List[float]"
                      : fn == "torch.jit._pickle.build_boollist"   ? "List[bool]"
                      : fn == "torch.jit._pickle.build_tensorlist" ? "List[Tensor]"
                                                                   : nullptr;
    if (tag) {
      const auto& a = tuple_args(args, fn, 1, 1);
      Node list;
      list.kind = Kind::kList;
      list.items = expect(a[0], Kind::kList, "the list argument").items;
      list.s = tag;
      return make(std::move(list));
    }
    fail("'" + fn + "' cannot be called here");
  }

  void set_requires_grad(at::Tensor& t) {
    if (!at::isFloatingType(t.scalar_type()) && !at::isComplexType(t.scalar_type())) {
      fail(std::string("requires_grad on a tensor of ") + c10::toString(t.scalar_type()) + " (only floating tensors take it)");
    }
    t.set_requires_grad(true);
  }

  at::Tensor rebuild(uint32_t storage_id, uint32_t offset_id, uint32_t size_id, uint32_t stride_id) {
    const at::Tensor& storage = expect(storage_id, Kind::kStorage, "a tensor's storage").t;
    const int64_t offset = expect(offset_id, Kind::kInt, "a storage offset").i;
    const std::vector<int64_t> size = int_tuple(size_id, "a tensor's size");
    const std::vector<int64_t> stride = int_tuple(stride_id, "a tensor's stride");
    if (size.size() != stride.size()) {
      fail("a tensor with " + std::to_string(size.size()) + " sizes and " + std::to_string(stride.size()) + " strides");
    }
    const int64_t available = storage.numel();
    const std::string shape = "size " + c10::str(at::IntArrayRef(size)) + ", stride " + c10::str(at::IntArrayRef(stride)) +
                              ", offset " + std::to_string(offset);
    if (offset < 0) fail("a tensor with " + shape + ": negative offset");
    bool empty = false;
    int64_t last = offset;  // the highest element index the tensor reaches
    for (size_t d = 0; d < size.size(); ++d) {
      if (size[d] < 0 || stride[d] < 0) fail("a tensor with " + shape + ": negative size or stride");
      if (size[d] == 0) empty = true;
    }
    if (!empty) {
      for (size_t d = 0; d < size.size(); ++d) {
        int64_t reach = 0;
        if (__builtin_mul_overflow(size[d] - 1, stride[d], &reach) || __builtin_add_overflow(last, reach, &last)) {
          fail("a tensor with " + shape + " overflows int64");
        }
      }
    }
    if ((empty && offset > available) || (!empty && last >= available)) {
      fail("a tensor with " + shape + " reaches element " + std::to_string(empty ? offset : last) +
           " of a storage of " + std::to_string(available) + " elements");
    }
    return storage.as_strided(size, stride, offset);
  }

  uint32_t storage(uint32_t pid_id) {
    const auto& pid = expect(pid_id, Kind::kTuple, "a persistent id").items;
    if (pid.size() != 5 || nodes_[pid[0]].kind != Kind::kStr || nodes_[pid[0]].s != "storage") {
      fail("a persistent id that is not ('storage', type, key, location, numel)");
    }
    const std::string type = expect(pid[1], Kind::kGlobal, "a storage type").s;
    const std::string key = expect(pid[2], Kind::kStr, "a storage key").s;
    expect(pid[3], Kind::kStr, "a storage location");
    const int64_t numel = expect(pid[4], Kind::kInt, "a storage's element count").i;
    const StorageType* st = nullptr;
    for (const auto& s : kStorageTypes) st = type == s.name ? &s : st;
    if (!st) fail("'" + type + "' is not a storage type");
    const auto cached = storages_.find(key);
    if (cached != storages_.end()) {
      if (nodes_[cached->second].t.scalar_type() != st->dtype) fail("storage '" + key + "' used with two dtypes");
      return cached->second;
    }
    const std::string record_name = prefix_ + "/data/" + key;
    const ZipRecord* rec = zip_.find(record_name);
    if (!rec) fail("storage '" + key + "' has no record '" + record_name + "'");
    const uint64_t item = c10::elementSize(st->dtype);
    if (numel < 0 || static_cast<uint64_t>(numel) > rec->size / item || static_cast<uint64_t>(numel) * item != rec->size) {
      fail("storage '" + key + "' claims " + std::to_string(numel) + " elements of " + std::to_string(item) +
           " bytes, its record has " + std::to_string(rec->size) + " bytes");
    }
    Node node;
    node.kind = Kind::kStorage;
    node.t = at::empty({numel}, at::TensorOptions().dtype(st->dtype));
    if (rec->size) std::memcpy(node.t.data_ptr(), zip_.bytes(*rec), rec->size);
    const uint32_t id = make(std::move(node));
    storages_.emplace(key, id);
    return id;
  }


  const uint8_t* p_;
  size_t n_;
  size_t pos_ = 0;
  size_t op_at_ = 0;
  const ZipArchive& zip_;
  std::string prefix_;
  const ReadLimits& limits_;
  std::vector<Node> nodes_;
  std::vector<uint32_t> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint64_t, uint32_t> memo_;
  std::unordered_map<std::string, uint32_t> storages_;
};

}  // namespace

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
