// SPDX-License-Identifier: Apache-2.0
#pragma once
// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), as TFRecord files
// checksum their records. Debian 12 ships no C++ CRC-32C library (no
// libcrc32c-dev; its abseil predates absl/crc), hence this small table-driven one.

#include <cstdint>
#include <string_view>

namespace fulgur::detail {

// CRC-32C of `data` ("123456789" gives 0xE3069283).
uint32_t crc32c(std::string_view data);

// TFRecord's masked form: rotate right by 15, add 0xa282ead8.
uint32_t masked_crc32c(std::string_view data);

}  // namespace fulgur::detail
