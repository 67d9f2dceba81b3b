// SPDX-License-Identifier: Apache-2.0
#pragma once
// The restricted unpickler (pickle.h): a machine over the pickle's bytes with a stack, a memo and
// the arena of values it builds. Its opcodes are in unpickler.cpp; the few callables they may
// call (tensor and storage rebuilds, dict classes, type tags), where tensor geometry is checked
// against the records, are in pickle_callables.cpp. Every read is bounds-checked; any error is a
// SerializationError naming the byte of the opcode.

#include <fulgur/serialization_error.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

#include "serialize/pickle.h"
#include "serialize/zip_reader.h"

namespace fulgur::detail::pickle {

// collections.OrderedDict and Lightning's AttributeDict: classes rebuilt as plain dicts.
bool is_dict_class(const std::string& g);

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

  // --- the opcodes (unpickler.cpp) -------------------------------------------
  uint32_t parse();

  // --- the callables (pickle_callables.cpp) ----------------------------------
  // A GLOBAL's node; refuses any global but the known callables and storage types.
  uint32_t global(const std::string& q);
  const std::vector<uint32_t>& tuple_args(uint32_t args, const std::string& fn, size_t lo, size_t hi);
  std::vector<int64_t> int_tuple(uint32_t id, const char* what);
  // REDUCE: the value of known callable `fn_id` applied to tuple `args`.
  uint32_t reduce(uint32_t fn_id, uint32_t args);
  void set_requires_grad(at::Tensor& t);
  // A view of a storage, its size, stride and offset checked against the storage's length.
  at::Tensor rebuild(uint32_t storage_id, uint32_t offset_id, uint32_t size_id, uint32_t stride_id);
  // BINPERSID: the storage a persistent id names, read once from its record.
  uint32_t storage(uint32_t pid_id);

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

}  // namespace fulgur::detail::pickle
