#include "plugins/python_pickle.h"

#include <caffe2/serialize/inline_container.h>
#include <caffe2/serialize/read_adapter_interface.h>
#include <torch/csrc/jit/serialization/unpickler.h>

#include <cstring>
#include <memory>
#include <set>
#include <vector>
#include <stdexcept>
#include <string>

namespace fulgur::detail {
namespace {

class BytesAdapter : public caffe2::serialize::ReadAdapterInterface {
 public:
  explicit BytesAdapter(const std::vector<char>& bytes) : bytes_(bytes) {}
  size_t size() const override { return bytes_.size(); }
  size_t read(uint64_t pos, void* buf, size_t n, const char*) const override {
    if (pos >= bytes_.size()) return 0;
    n = std::min<size_t>(n, bytes_.size() - pos);
    std::memcpy(buf, bytes_.data() + pos, n);
    return n;
  }

 private:
  const std::vector<char>& bytes_;
};

[[noreturn]] void unsupported(const std::string& what) {
  throw std::runtime_error("not a pickle this reader knows: " + what);
}

uint32_t le32(const std::string& s, size_t at) {
  if (at + 4 > s.size()) unsupported("truncated");
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(s[at + i]);
  return v;
}

// Copies the pickle opcode by opcode, tracking where each value on the
// pickle's stack begins in the output, and changes what libtorch's unpickler
// cannot take:
//  - a push of the OrderedDict class followed by EMPTY_TUPLE REDUCE becomes
//    EMPTY_DICT;
//  - SETITEM (one pair; libtorch knows only SETITEMS) becomes MARK before the
//    key and SETITEMS after the value;
//  - BUILD, which in a state_dict only gives an OrderedDict its _metadata
//    attribute, is dropped together with the bytes that pushed that state.
std::string rewrite(const std::string& in) {
  std::string out;
  out.reserve(in.size() + 64);
  std::set<uint32_t> class_memo;  // memo slots holding the OrderedDict class
  struct Item {
    size_t start;  // offset in `out` where the pushes of this value begin
    bool mark;
  };
  std::vector<Item> stack;
  auto need = [&](size_t n) {
    if (stack.size() < n) unsupported("stack underflow");
  };
  auto pop_to_mark = [&]() -> size_t {  // returns the mark's start
    while (!stack.empty() && !stack.back().mark) stack.pop_back();
    if (stack.empty()) unsupported("no MARK");
    const size_t start = stack.back().start;
    stack.pop_back();
    return start;
  };
  auto line_end = [&](size_t from) {
    const size_t nl = in.find('\n', from);
    if (nl == std::string::npos) unsupported("unterminated line argument");
    return nl + 1;
  };
  auto push_dict_for_class = [&](size_t at, size_t start) {
    if (at + 2 > in.size() || in[at] != ')' || in[at + 1] != 'R') unsupported("OrderedDict built with arguments");
    out.push_back('}');
    stack.push_back({start, false});
    return at + 2;
  };
  size_t i = 0;
  while (i < in.size()) {
    const unsigned char op = static_cast<unsigned char>(in[i]);
    const size_t start = out.size();
    size_t next = i + 1;
    int pops = 0, pushes = 0;
    bool to_mark = false;
    switch (op) {
      case '(': stack.push_back({start, true}); break;                   // MARK
      case '.': break;                                                   // STOP
      case 'N': case ')': case '}': case ']': case 0x88: case 0x89: case '2': pushes = 1; break;
      case 'Q': pops = 1; pushes = 1; break;                             // BINPERSID
      case 'R': pops = 2; pushes = 1; break;                             // REDUCE
      case 0x81: pops = 2; pushes = 1; break;                            // NEWOBJ
      case 'a': pops = 1; break;                                         // APPEND
      case '0': pops = 1; break;                                         // POP
      case 'e': case 'u': case '1': to_mark = true; break;               // APPENDS, SETITEMS, POP_MARK
      case 't': case 'l': case 'd': to_mark = true; pushes = 1; break;   // TUPLE, LIST, DICT
      case 0x85: pops = 1; pushes = 1; break;                            // TUPLE1
      case 0x86: pops = 2; pushes = 1; break;                            // TUPLE2
      case 0x87: pops = 3; pushes = 1; break;                            // TUPLE3
      case 's': {                                                        // SETITEM
        need(3);
        const size_t key_start = stack[stack.size() - 2].start;
        out.insert(out.begin() + static_cast<std::ptrdiff_t>(key_start), '(');
        out.push_back('u');
        stack.pop_back();
        stack.pop_back();
        i = next;
        continue;
      }
      case 'b': {                                                        // BUILD
        need(2);
        out.resize(stack.back().start);  // drop the state's bytes
        stack.pop_back();
        i = next;
        continue;
      }
      case 0x80: next = i + 2; break;                                    // PROTO
      case 'K': next = i + 2; pushes = 1; break;                         // BININT1
      case 'q': next = i + 2; break;                                     // BINPUT
      case 'r': next = i + 5; break;                                     // LONG_BINPUT
      case 'M': next = i + 3; pushes = 1; break;                         // BININT2
      case 'J': next = i + 5; pushes = 1; break;                         // BININT
      case 'G': next = i + 9; pushes = 1; break;                         // BINFLOAT
      case 'h': case 'j': {                                              // BINGET, LONG_BINGET
        if (i + (op == 'h' ? 2 : 5) > in.size()) unsupported("truncated");
        const uint32_t slot = op == 'h' ? static_cast<unsigned char>(in[i + 1]) : le32(in, i + 1);
        next = i + (op == 'h' ? 2 : 5);
        if (class_memo.count(slot)) {
          i = push_dict_for_class(next, start);
          continue;
        }
        pushes = 1;
        break;
      }
      case 'U': case 'C': case 0x8a:                                     // short strings/bytes, LONG1
        if (i + 2 > in.size()) unsupported("truncated");
        next = i + 2 + static_cast<unsigned char>(in[i + 1]);
        pushes = 1;
        break;
      case 'X': case 'T': case 'B': case 0x8b:                           // BINUNICODE, BINSTRING, BINBYTES, LONG4
        next = i + 5 + le32(in, i + 1);
        pushes = 1;
        break;
      case 'I': case 'L': case 'F': case 'S': case 'V': case 'g':
        next = line_end(i + 1);
        pushes = 1;
        break;
      case 'p': next = line_end(i + 1); break;                           // PUT
      case 'c': {                                                        // GLOBAL module\nname\n
        next = line_end(line_end(i + 1));
        if (in.compare(i + 1, next - i - 1, "collections\nOrderedDict\n") == 0) {
          if (next + 2 <= in.size() && in[next] == 'q') {
            class_memo.insert(static_cast<unsigned char>(in[next + 1]));
            next += 2;
          } else if (next + 5 <= in.size() && in[next] == 'r') {
            class_memo.insert(le32(in, next + 1));
            next += 5;
          }
          i = push_dict_for_class(next, start);
          continue;
        }
        pushes = 1;
        break;
      }
      default:
        unsupported("opcode " + std::to_string(op));
    }
    if (next > in.size()) unsupported("truncated");
    out.append(in, i, next - i);
    size_t value_start = start;
    if (to_mark) value_start = pop_to_mark();
    if (pops > 0) {
      need(static_cast<size_t>(pops));
      value_start = stack[stack.size() - static_cast<size_t>(pops)].start;
      stack.resize(stack.size() - static_cast<size_t>(pops));
    }
    if (pushes > 0) stack.push_back({value_start, false});
    i = next;
    if (op == '.') break;
  }
  return out;
}

}  // namespace

c10::IValue load_python_pickle(const std::vector<char>& bytes) {
  caffe2::serialize::PyTorchStreamReader reader(std::make_unique<BytesAdapter>(bytes));
  at::DataPtr pkl;
  size_t size = 0;
  std::tie(pkl, size) = reader.getRecord("data.pkl");
  const std::string pickle = rewrite(std::string(static_cast<const char*>(pkl.get()), size));
  size_t pos = 0;
  auto read = [&](char* buf, size_t n) -> size_t {
    n = std::min(n, pickle.size() - pos);
    std::memcpy(buf, pickle.data() + pos, n);
    pos += n;
    return n;
  };
  auto read_record = [&](const std::string& name) { return std::get<0>(reader.getRecord("data/" + name)); };
  torch::jit::Unpickler unpickler(read, nullptr, nullptr, read_record, c10::Device(c10::kCPU));
  unpickler.set_version(reader.version());
  c10::IValue value = unpickler.parse_ivalue();
  // Dicts made from EMPTY_DICT are typed Dict[Any, Any]; a state_dict's keys
  // are strings, so retype the top level as Dict[str, Any].
  if (!value.isGenericDict()) return value;
  c10::impl::GenericDict typed(c10::StringType::get(), c10::AnyType::get());
  for (const auto& kv : value.toGenericDict()) {
    if (!kv.key().isString()) unsupported("a dict key that is not a string (" + kv.key().tagKind() + ")");
    typed.insert(kv.key().toStringRef(), kv.value());
  }
  return c10::IValue(typed);
}

}  // namespace fulgur::detail
