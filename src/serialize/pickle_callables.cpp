// SPDX-License-Identifier: Apache-2.0
// The callables the restricted unpickler may call (pickle_parser.h): the globals it knows, tensor
// and storage rebuilds, the dict classes and TorchScript's type-tag helpers.

#include "serialize/pickle_parser.h"

#include <ATen/ATen.h>

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

}  // namespace

bool is_dict_class(const std::string& g) { return g == "collections.OrderedDict" || g.find("AttributeDict") != std::string::npos; }

uint32_t Parser::global(const std::string& q) {
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

const std::vector<uint32_t>& Parser::tuple_args(uint32_t args, const std::string& fn, size_t lo, size_t hi) {
  const auto& items = expect(args, Kind::kTuple, ("the arguments of " + fn).c_str()).items;
  if (items.size() < lo || items.size() > hi) {
    fail(fn + " takes " + std::to_string(lo) + (lo == hi ? "" : " to " + std::to_string(hi)) + " arguments, got " +
         std::to_string(items.size()));
  }
  return items;
}

std::vector<int64_t> Parser::int_tuple(uint32_t id, const char* what) {
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

uint32_t Parser::reduce(uint32_t fn_id, uint32_t args) {
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

void Parser::set_requires_grad(at::Tensor& t) {
  if (!at::isFloatingType(t.scalar_type()) && !at::isComplexType(t.scalar_type())) {
    fail(std::string("requires_grad on a tensor of ") + c10::toString(t.scalar_type()) + " (only floating tensors take it)");
  }
  t.set_requires_grad(true);
}

at::Tensor Parser::rebuild(uint32_t storage_id, uint32_t offset_id, uint32_t size_id, uint32_t stride_id) {
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

uint32_t Parser::storage(uint32_t pid_id) {
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

}  // namespace fulgur::detail::pickle
