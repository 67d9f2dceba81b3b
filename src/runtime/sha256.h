// SPDX-License-Identifier: Apache-2.0
#pragma once
// SHA-256 (FIPS 180-4), for content keys (the XLA compile cache's entry names). Debian's
// libraries that have it (OpenSSL's libcrypto, nettle) are not linked by fulgur, and one hash
// does not justify a new dependency: this is the standard's algorithm as written, checked
// against its test vectors (tests/test_compile_cache.cpp).

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace fulgur::runtime {

using Sha256Digest = std::array<uint8_t, 32>;

// An incremental SHA-256: update() any number of times, then digest() once.
class Sha256 {
 public:
  Sha256();
  void update(std::string_view data);
  // The digest of everything given to update(). REQUIRES: called once; update() not after it.
  Sha256Digest digest();

 private:
  void block(const uint8_t* p);

  std::array<uint32_t, 8> h_;
  std::array<uint8_t, 64> buffer_{};
  size_t buffered_ = 0;
  uint64_t total_bytes_ = 0;
};

Sha256Digest sha256(std::string_view data);

// Lowercase hexadecimal, two digits per byte.
std::string to_hex(const Sha256Digest& digest);

}  // namespace fulgur::runtime
