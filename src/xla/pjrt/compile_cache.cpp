// SPDX-License-Identifier: Apache-2.0
#include "xla/pjrt/compile_cache.h"

#include "runtime/env.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <set>
#include <string>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "loggers/crc32c.h"
#include "runtime/log.h"
#include "xla/pjrt/metrics.h"

namespace fulgur::xla::pjrt {
namespace {

constexpr char kMagic[8] = {'F', 'L', 'G', 'X', 'L', 'A', 'E', 'X'};

void put_u32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out += static_cast<char>(v >> (8 * i));
}
void put_u64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out += static_cast<char>(v >> (8 * i));
}
uint32_t get_u32(std::string_view s, size_t at) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t{static_cast<uint8_t>(s[at + i])} << (8 * i);
  return v;
}
uint64_t get_u64(std::string_view s, size_t at) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t{static_cast<uint8_t>(s[at + i])} << (8 * i);
  return v;
}

// CRC-32C of the header's first 56 bytes and then the payload.
uint32_t entry_checksum(std::string_view header56, std::string_view payload) {
  std::string covered;
  covered.reserve(header56.size() + payload.size());
  covered.append(header56);
  covered.append(payload);
  return fulgur::detail::crc32c(covered);
}

std::string errno_text() { return std::strerror(errno); }

// Warns once per process for each distinct `what` (a folder, an entry's path and reason), and a
// given text once in the whole run (runtime::warn_once): every rank of every stage's workers
// meets the same folder and the same entries.
void warn_once(const std::string& what, const std::string& message) {
  static std::mutex& mu = *new std::mutex;
  static auto& warned = *new std::set<std::string>;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!warned.insert(what).second) return;
  }
  runtime::warn_once("xla compile cache: " + message);
}

std::mutex default_dir_mu;
std::string default_dir;

// Why a file or folder of the cache is not to be trusted, or "" when it is: owned by this user
// and writable by no one else.
std::string ownership_problem(const struct stat& st) {
  if (st.st_uid != ::geteuid())
    return "owned by uid " + std::to_string(st.st_uid) + ", not by this user (uid " + std::to_string(::geteuid()) + ")";
  if (st.st_mode & (S_IWGRP | S_IWOTH)) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return std::string("writable by other users (mode ") + mode + ")";
  }
  return "";
}

}  // namespace

CacheKey compile_cache_key(std::string_view program, std::string_view compile_options,
                           std::string_view plugin_identity) {
  runtime::Sha256 h;
  const std::string_view tag = "fulgur xla compile cache key";
  for (std::string_view part : {tag, plugin_identity, compile_options, program}) {
    std::string length;
    put_u64(length, part.size());
    h.update(length);
    h.update(part);
  }
  return h.digest();
}

std::string encode_cache_entry(const CacheKey& key, std::string_view payload) {
  std::string out(kMagic, sizeof kMagic);
  put_u32(out, kCacheFormatVersion);
  put_u32(out, 0);
  out.append(reinterpret_cast<const char*>(key.data()), key.size());
  put_u64(out, payload.size());
  put_u32(out, entry_checksum(out, payload));
  put_u32(out, 0);
  out.append(payload);
  return out;
}

std::optional<std::string_view> decode_cache_entry(std::string_view entry, const CacheKey& key, std::string* why) {
  auto fail = [&](const std::string& reason) -> std::optional<std::string_view> {
    if (why) *why = reason;
    return std::nullopt;
  };
  if (entry.size() < sizeof kMagic || entry.compare(0, sizeof kMagic, std::string_view(kMagic, sizeof kMagic)) != 0)
    return fail("not a compile cache entry (bad magic)");
  if (entry.size() < kCacheHeaderBytes)
    return fail("truncated: " + std::to_string(entry.size()) + " bytes, shorter than the " +
                std::to_string(kCacheHeaderBytes) + "-byte header");
  const uint32_t version = get_u32(entry, 8);
  if (version != kCacheFormatVersion)
    return fail("format version " + std::to_string(version) + ", this fulgur reads " +
                std::to_string(kCacheFormatVersion));
  const uint64_t size = get_u64(entry, 48);
  if (size > kMaxCachePayloadBytes)
    return fail("a payload of " + std::to_string(size) + " bytes, more than the limit of " +
                std::to_string(kMaxCachePayloadBytes));
  if (entry.size() != kCacheHeaderBytes + size)
    return fail((entry.size() < kCacheHeaderBytes + size ? "truncated: " : "trailing bytes: ") +
                std::to_string(entry.size()) + " bytes, the header says " + std::to_string(kCacheHeaderBytes + size));
  if (get_u32(entry, 12) != 0 || get_u32(entry, 60) != 0) return fail("reserved header bytes are not zero");
  const std::string_view payload = entry.substr(kCacheHeaderBytes);
  if (get_u32(entry, 56) != entry_checksum(entry.substr(0, 56), payload)) return fail("checksum mismatch");
  if (entry.compare(16, key.size(), std::string_view(reinterpret_cast<const char*>(key.data()), key.size())) != 0) {
    CacheKey written;
    std::memcpy(written.data(), entry.data() + 16, written.size());
    return fail("written under another key (" + runtime::to_hex(written) + ")");
  }
  return payload;
}

std::optional<std::string> compile_cache_dir() {
  const std::string set = runtime::env_string("FULGUR_XLA_CACHE_DIR");
  if (set == "off") return std::nullopt;
  if (!set.empty()) return set;
  std::lock_guard<std::mutex> lock(default_dir_mu);
  if (default_dir.empty()) return std::nullopt;
  return default_dir;
}

void set_default_compile_cache_dir(const std::string& dir) {
  std::lock_guard<std::mutex> lock(default_dir_mu);
  default_dir = dir;
}

CompileCache::CompileCache(std::string dir) : dir_(std::move(dir)) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(dir_, ec)) {
    const fs::path path(dir_);
    if (path.has_parent_path()) fs::create_directories(path.parent_path(), ec);
    // Made private: entries are code this user's processes will run.
    if (::mkdir(dir_.c_str(), 0700) != 0 && errno != EEXIST) {
      warn_once(dir_, "cannot create the folder " + dir_ + " (" + errno_text() +
                          "); compiled programs are not kept. Set FULGUR_XLA_CACHE_DIR to a writable folder, or to "
                          "\"off\"");
      return;
    }
  }
  struct stat st {};
  if (::stat(dir_.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    warn_once(dir_, dir_ + " is not a folder; compiled programs are not kept (FULGUR_XLA_CACHE_DIR moves the cache)");
    return;
  }
  if (const std::string problem = ownership_problem(st); !problem.empty()) {
    warn_once(dir_, "the folder " + dir_ + " is " + problem +
                        "; its entries are code this process would run, so the cache is off. Use a folder of "
                        "your own (chmod go-w), or set FULGUR_XLA_CACHE_DIR");
    return;
  }
  usable_ = true;
}

std::string CompileCache::entry_path(const CacheKey& key) const { return dir_ + "/" + runtime::to_hex(key) + ".xla"; }

void CompileCache::reject(const CacheKey& key, const std::string& why) const {
  detail::count_cache_rejected();
  const std::string path = entry_path(key);
  warn_once(path + "\n" + why,
            "ignoring " + path + ": " + why + "; compiling the program again and replacing the entry");
}

std::optional<std::string> CompileCache::load(const CacheKey& key) const {
  const std::string path = entry_path(key);
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return std::nullopt;
    reject(key, errno == ELOOP ? "it is a symbolic link" : "it cannot be opened (" + errno_text() + ")");
    return std::nullopt;
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    reject(key, "fstat failed (" + errno_text() + ")");
    return std::nullopt;
  }
  if (!S_ISREG(st.st_mode)) {
    reject(key, "not a regular file");
    return std::nullopt;
  }
  if (const std::string problem = ownership_problem(st); !problem.empty()) {
    reject(key, "it is " + problem);
    return std::nullopt;
  }
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  if (file_size > kCacheHeaderBytes + kMaxCachePayloadBytes) {
    reject(key, std::to_string(file_size) + " bytes, more than an entry may have");
    return std::nullopt;
  }
  std::string bytes(file_size, '\0');
  size_t got = 0;
  while (got < bytes.size()) {
    const ssize_t n = ::read(fd, bytes.data() + got, bytes.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      reject(key, "reading failed (" + errno_text() + ")");
      return std::nullopt;
    }
    if (n == 0) break;  // shortened while read; decode reports the truncation
    got += static_cast<size_t>(n);
  }
  bytes.resize(got);
  detail::count_cache_bytes_read(static_cast<int64_t>(got));
  std::string why;
  const std::optional<std::string_view> payload = decode_cache_entry(bytes, key, &why);
  if (!payload) {
    reject(key, why);
    return std::nullopt;
  }
  return std::string(*payload);
}

bool CompileCache::store(const CacheKey& key, std::string_view payload) const {
  const std::string path = entry_path(key);
  const std::string bytes = encode_cache_entry(key, payload);
  // mkstemp makes the file with mode 0600 under a name no other writer has.
  std::string temp = dir_ + "/." + runtime::to_hex(key) + ".tmp.XXXXXX";
  const int fd = ::mkostemp(temp.data(), O_CLOEXEC);
  auto fail = [&](const std::string& step) {
    warn_once(dir_ + "\nwrite", "writing " + path + " failed at " + step + " (" + errno_text() +
                                    "); the program is compiled again by later processes (warned once)");
    return false;
  };
  if (fd < 0) return fail("creating a temporary file");
  bool ok = true;
  for (size_t done = 0; ok && done < bytes.size();) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) ok = false;
    else done += static_cast<size_t>(n);
  }
  const char* step = ok ? nullptr : "write";
  if (ok && ::fsync(fd) != 0) ok = false, step = "fsync";
  if (::close(fd) != 0 && ok) ok = false, step = "close";
  if (ok && ::rename(temp.c_str(), path.c_str()) != 0) ok = false, step = "rename";
  if (!ok) {
    const int saved = errno;
    ::unlink(temp.c_str());
    errno = saved;
    return fail(step);
  }
  // The rename itself reaches the disk with the folder's metadata.
  if (const int dfd = ::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  detail::count_cache_bytes_written(static_cast<int64_t>(bytes.size()));
  return true;
}

}  // namespace fulgur::xla::pjrt
