// SPDX-License-Identifier: Apache-2.0
#include "serialize/zip_reader.h"

#include <zlib.h>

#include <algorithm>
#include <cstring>

namespace fulgur::detail {
namespace {

constexpr uint32_t kLocalHeader = 0x04034b50;
constexpr uint32_t kCentralHeader = 0x02014b50;
constexpr uint32_t kEnd = 0x06054b50;
constexpr uint32_t kEnd64 = 0x06064b50;
constexpr uint32_t kEnd64Locator = 0x07064b50;
constexpr size_t kEndSize = 22;
constexpr size_t kCentralSize = 46;
constexpr size_t kLocalSize = 30;

// Little-endian reads within [0, size); every read is bounds-checked.
class Cursor {
 public:
  Cursor(const uint8_t* data, size_t size, const std::string& source) : data_(data), size_(size), source_(source) {}
  [[noreturn]] void fail(const std::string& what) const {
    throw SerializationError(source_ + " is truncated or corrupt (not a well-formed torch zip archive): " + what);
  }
  void need(uint64_t at, uint64_t n, const char* what) const {
    if (at > size_ || n > size_ - at) {
      fail(std::string(what) + " at byte " + std::to_string(at) + " (" + std::to_string(n) +
           " bytes) reaches past the end of the " + std::to_string(size_) + " bytes");
    }
  }
  uint64_t le(uint64_t at, int n, const char* what) const {
    need(at, static_cast<uint64_t>(n), what);
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; --i) v = (v << 8) | data_[at + static_cast<uint64_t>(i)];
    return v;
  }
  uint16_t u16(uint64_t at, const char* what) const { return static_cast<uint16_t>(le(at, 2, what)); }
  uint32_t u32(uint64_t at, const char* what) const { return static_cast<uint32_t>(le(at, 4, what)); }
  uint64_t u64(uint64_t at, const char* what) const { return le(at, 8, what); }
  size_t size() const { return size_; }
  const uint8_t* data() const { return data_; }

 private:
  const uint8_t* data_;
  size_t size_;
  const std::string& source_;
};

struct Directory {
  uint64_t entries = 0;
  uint64_t offset = 0;
  uint64_t size = 0;
  uint64_t end = 0;  // where the structures after the central directory begin
};

Directory find_directory(const Cursor& c) {
  if (c.size() < kEndSize) c.fail("only " + std::to_string(c.size()) + " bytes, a zip archive has at least 22");
  // The end record is the last 22 bytes, or comes before a comment of at most 64 KiB.
  const uint64_t lowest = c.size() > kEndSize + 0xffff ? c.size() - kEndSize - 0xffff : 0;
  uint64_t at = c.size() - kEndSize;
  for (;; --at) {
    if (c.u32(at, "end record") == kEnd && at + kEndSize + c.u16(at + 20, "comment length") == c.size()) break;
    if (at == lowest) c.fail("no end-of-central-directory record");
  }
  Directory d;
  if (c.u16(at + 4, "disk number") != 0 && c.u16(at + 4, "disk number") != 0xffff) c.fail("multi-disk archive");
  d.entries = c.u16(at + 10, "entry count");
  d.size = c.u32(at + 12, "directory size");
  d.offset = c.u32(at + 16, "directory offset");
  d.end = at;
  if (at >= 20 && c.u32(at - 20, "zip64 locator") == kEnd64Locator) {
    const uint64_t rec = c.u64(at - 20 + 8, "zip64 end offset");
    if (rec > at - 20) c.fail("zip64 end record offset " + std::to_string(rec) + " lies after its locator");
    if (c.u32(rec, "zip64 end record") != kEnd64) c.fail("no zip64 end record at byte " + std::to_string(rec));
    d.entries = c.u64(rec + 32, "zip64 entry count");
    d.size = c.u64(rec + 40, "zip64 directory size");
    d.offset = c.u64(rec + 48, "zip64 directory offset");
    d.end = rec;
  }
  if (d.offset > d.end || d.size > d.end - d.offset) {
    c.fail("central directory (" + std::to_string(d.size) + " bytes at " + std::to_string(d.offset) +
           ") does not end before byte " + std::to_string(d.end));
  }
  return d;
}

// One entry of the central directory, checked against its local header.
struct Entry {
  ZipRecord record;
  uint64_t local = 0;  // the offset of its local header
  uint64_t next = 0;   // the offset of the next entry
};

// zip64 extended information (the `extra_len` bytes at `e` of the entry of `name`): the 64-bit
// values of the fields saturated in the entry.
void read_zip64_extra(const Cursor& c, uint64_t e, uint64_t extra_len, const std::string& name, uint64_t& usize,
                      uint64_t& csize, uint64_t& local) {
  for (const uint64_t e_end = e + extra_len; e + 4 <= e_end;) {
    const uint16_t id = c.u16(e, "extra id");
    const uint16_t len = c.u16(e + 2, "extra length");
    if (e + 4 + len > e_end) c.fail("extra field of '" + name + "' runs past its entry");
    if (id == 0x0001) {
      uint64_t f = e + 4;
      auto take = [&](uint64_t& v) {
        if (f + 8 > e + 4 + len) c.fail("zip64 field of '" + name + "' is too short");
        v = c.u64(f, "zip64 field");
        f += 8;
      };
      if (usize == 0xffffffffu) take(usize);
      if (csize == 0xffffffffu) take(csize);
      if (local == 0xffffffffu) take(local);
    }
    e += 4 + len;
  }
}

// Central directory entry `i`, at `at` in `dir`.
Entry read_entry(const Cursor& c, const Directory& dir, uint64_t at, uint64_t i) {
  const uint64_t dir_end = dir.offset + dir.size;
  if (at + kCentralSize > dir_end) c.fail("central directory entry " + std::to_string(i) + " runs past the directory");
  if (c.u32(at, "central entry") != kCentralHeader) c.fail("bad central directory entry " + std::to_string(i));
  const uint16_t flags = c.u16(at + 8, "flags");
  const uint16_t method = c.u16(at + 10, "method");
  Entry entry;
  ZipRecord& r = entry.record;
  r.crc32 = c.u32(at + 16, "crc32");
  uint64_t csize = c.u32(at + 20, "compressed size");
  uint64_t usize = c.u32(at + 24, "size");
  const uint16_t name_len = c.u16(at + 28, "name length");
  const uint16_t extra_len = c.u16(at + 30, "extra length");
  const uint16_t comment_len = c.u16(at + 32, "comment length");
  uint64_t local = c.u32(at + 42, "local header offset");
  entry.next = at + kCentralSize + name_len + extra_len + comment_len;
  if (entry.next > dir_end) c.fail("central directory entry " + std::to_string(i) + " runs past the directory");
  r.name.assign(reinterpret_cast<const char*>(c.data() + at + kCentralSize), name_len);
  read_zip64_extra(c, at + kCentralSize + name_len, extra_len, r.name, usize, csize, local);
  if (flags & 1) c.fail("record '" + r.name + "' is encrypted");
  if (method != 0) {
    c.fail("record '" + r.name + "' is compressed (method " + std::to_string(method) +
           "); torch archives store records uncompressed");
  }
  if (csize != usize) c.fail("record '" + r.name + "' is stored with differing sizes");
  r.size = usize;
  if (local >= dir.offset || c.u32(local, "local header") != kLocalHeader) {
    c.fail("record '" + r.name + "' has no local header at byte " + std::to_string(local));
  }
  const uint64_t l_name = c.u16(local + 26, "local name length");
  const uint64_t l_extra = c.u16(local + 28, "local extra length");
  c.need(local + kLocalSize, l_name, "local name");
  if (l_name != name_len || std::memcmp(c.data() + local + kLocalSize, r.name.data(), name_len) != 0) {
    c.fail("record '" + r.name + "': its local header names another record");
  }
  r.data_offset = local + kLocalSize + l_name + l_extra;
  if (r.data_offset > dir.offset || r.size > dir.offset - r.data_offset) {
    c.fail("record '" + r.name + "' (" + std::to_string(r.size) + " bytes at " + std::to_string(r.data_offset) +
           ") reaches past the records into the central directory");
  }
  entry.local = local;
  return entry;
}

// The bytes a record takes, from its local header to the end of its data.
struct Span {
  uint64_t begin, end;
  size_t record;
};

void check_no_overlap(const Cursor& c, std::vector<Span> spans, const std::vector<ZipRecord>& records) {
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < spans.size(); ++i) {
    if (spans[i].begin < spans[i - 1].end) {
      c.fail("records '" + records[spans[i - 1].record].name + "' and '" + records[spans[i].record].name +
             "' overlap");
    }
  }
}

void check_crcs(const uint8_t* data, const std::vector<ZipRecord>& records, const std::string& source) {
  for (const ZipRecord& r : records) {
    uLong crc = crc32(0L, Z_NULL, 0);
    // zlib takes lengths as uInt: feed large records in pieces.
    for (uint64_t done = 0; done < r.size;) {
      const uInt n = static_cast<uInt>(std::min<uint64_t>(r.size - done, 1u << 30));
      crc = crc32(crc, data + r.data_offset + done, n);
      done += n;
    }
#ifndef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION  // fuzzers reach past the CRC only without this check
    if (static_cast<uint32_t>(crc) != r.crc32) {
      throw SerializationError(source + ": record '" + r.name + "' is corrupt (its CRC32 is " + std::to_string(crc) +
                               ", the archive says " + std::to_string(r.crc32) + ")");
    }
#endif
  }
}

}  // namespace

ZipArchive::ZipArchive(const uint8_t* data, size_t size, std::string source, const ReadLimits& limits)
    : data_(data), source_(std::move(source)) {
  const Cursor c(data, size, source_);
  const Directory dir = find_directory(c);
  if (dir.entries > limits.max_records) {
    c.fail(std::to_string(dir.entries) + " records, above the limit of " + std::to_string(limits.max_records) +
           " (ReadLimits::max_records)");
  }
  // Each entry takes at least 46 bytes of the directory: this bounds the reservation.
  if (dir.entries > dir.size / kCentralSize) {
    c.fail(std::to_string(dir.entries) + " records announced in a central directory of " + std::to_string(dir.size) +
           " bytes");
  }
  records_.reserve(dir.entries);
  std::vector<Span> spans;
  spans.reserve(dir.entries);
  uint64_t at = dir.offset;
  for (uint64_t i = 0; i < dir.entries; ++i) {
    Entry e = read_entry(c, dir, at, i);
    if (!by_name_.emplace(e.record.name, records_.size()).second) c.fail("record '" + e.record.name + "' appears twice");
    spans.push_back({e.local, e.record.data_offset + e.record.size, records_.size()});
    records_.push_back(std::move(e.record));
    at = e.next;
  }
  check_no_overlap(c, std::move(spans), records_);
  check_crcs(data, records_, source_);
}

const ZipRecord* ZipArchive::find(const std::string& name) const {
  const auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &records_[it->second];
}

}  // namespace fulgur::detail
