// SPDX-License-Identifier: Apache-2.0
#pragma once
// Writes a zip archive of stored records with correct CRCs, as torch.save
// lays them out (for tests and fuzz targets that craft archives).

#include <zlib.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace fulgur::testing {

inline std::string stored_zip(const std::vector<std::pair<std::string, std::string>>& records) {
  std::string out, dir;
  auto le = [](std::string& s, uint64_t v, int n) {
    for (int i = 0; i < n; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  };
  for (const auto& [name, data] : records) {
    const uint32_t crc = static_cast<uint32_t>(crc32(0, reinterpret_cast<const Bytef*>(data.data()),
                                                     static_cast<uInt>(data.size())));
    const uint64_t offset = out.size();
    le(out, 0x04034b50, 4);
    le(out, 20, 2), le(out, 0, 2), le(out, 0, 2), le(out, 0, 2), le(out, 0, 2);
    le(out, crc, 4), le(out, data.size(), 4), le(out, data.size(), 4);
    le(out, name.size(), 2), le(out, 0, 2);
    out += name + data;
    le(dir, 0x02014b50, 4);
    le(dir, 20, 2), le(dir, 20, 2), le(dir, 0, 2), le(dir, 0, 2), le(dir, 0, 2), le(dir, 0, 2);
    le(dir, crc, 4), le(dir, data.size(), 4), le(dir, data.size(), 4);
    le(dir, name.size(), 2), le(dir, 0, 2), le(dir, 0, 2), le(dir, 0, 2), le(dir, 0, 2), le(dir, 0, 4);
    le(dir, offset, 4);
    dir += name;
  }
  const uint64_t dir_offset = out.size();
  out += dir;
  le(out, 0x06054b50, 4);
  le(out, 0, 2), le(out, 0, 2), le(out, records.size(), 2), le(out, records.size(), 2);
  le(out, dir.size(), 4), le(out, dir_offset, 4), le(out, 0, 2);
  return out;
}

}  // namespace fulgur::testing
