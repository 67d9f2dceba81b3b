// SPDX-License-Identifier: Apache-2.0
#pragma once
// Protocol Buffers wire format, the few field kinds TensorBoard's event
// messages use. Hand-written: the logger encodes five small messages, which is
// less than generating them with protoc and linking libprotobuf (a dependency
// every program linking fulgur would inherit).

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace fulgur::detail {

// Appends fields to a message in the order called. Not thread safe.
class ProtobufWriter {
 public:
  // int32, int64 (two's complement, 10 bytes when negative), bool, enum: wire type 0.
  void varint(int field, int64_t value) {
    key(field, 0);
    raw_varint(static_cast<uint64_t>(value));
  }
  // double: wire type 1, little-endian.
  void fixed_double(int field, double value) {
    key(field, 1);
    uint64_t bits;
    std::memcpy(&bits, &value, sizeof bits);
    for (int i = 0; i < 8; ++i) out_.push_back(static_cast<char>(bits >> (8 * i)));
  }
  // float: wire type 5, little-endian.
  void fixed_float(int field, float value) {
    key(field, 5);
    uint32_t bits;
    std::memcpy(&bits, &value, sizeof bits);
    for (int i = 0; i < 4; ++i) out_.push_back(static_cast<char>(bits >> (8 * i)));
  }
  // string, bytes, or an embedded message's encoding: wire type 2.
  void bytes(int field, std::string_view value) {
    key(field, 2);
    raw_varint(value.size());
    out_.append(value);
  }
  const std::string& str() const { return out_; }

 private:
  void key(int field, int wire_type) { raw_varint((static_cast<uint64_t>(field) << 3) | wire_type); }
  void raw_varint(uint64_t v) {
    while (v >= 0x80) {
      out_.push_back(static_cast<char>((v & 0x7F) | 0x80));
      v >>= 7;
    }
    out_.push_back(static_cast<char>(v));
  }
  std::string out_;
};

}  // namespace fulgur::detail
