// SPDX-License-Identifier: Apache-2.0
#pragma once
// A checked reader of the zip archives torch.save and torch::pickle_save
// write: stored (uncompressed) records, optionally with zip64 fields.
//
// Every offset and length is checked against the buffer before it is used,
// records may not overlap (so no byte is handed out twice), and every record's
// CRC32 is verified when the archive is opened. Nothing is allocated in
// proportion to a length read from the bytes.

#include "serialize/limits.h"

#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace fulgur::detail {

struct ZipRecord {
  std::string name;
  uint64_t data_offset = 0;  // of the first byte of the record's data in the buffer
  uint64_t size = 0;
  uint32_t crc32 = 0;
};

class ZipArchive {
 public:
  // REQUIRES: `data` outlives the archive. `source` names the bytes in errors
  // (a file path, or "the payload from rank 1"). Throws SerializationError.
  ZipArchive(const uint8_t* data, size_t size, std::string source, const ReadLimits& limits);

  // nullptr when the archive has no record of that name.
  const ZipRecord* find(const std::string& name) const;
  const uint8_t* bytes(const ZipRecord& r) const { return data_ + r.data_offset; }
  const std::vector<ZipRecord>& records() const { return records_; }
  const std::string& source() const { return source_; }

 private:
  const uint8_t* data_;
  std::string source_;
  std::vector<ZipRecord> records_;
  std::unordered_map<std::string, size_t> by_name_;
};

}  // namespace fulgur::detail
