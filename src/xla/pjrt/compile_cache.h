// SPDX-License-Identifier: Apache-2.0
#pragma once
// A folder of compiled programs (PJRT's serialized executables) that later processes load
// instead of compiling again: each stage (fit, validate, test, predict) starts new workers, and
// every rank compiles the same graphs. Client::compile (client.h) uses it.
//
// An entry is one file, <folder>/<key in hex>.xla, in this format (integers little-endian):
//    0  magic "FLGXLAEX"
//    8  format version (u32, kCacheFormatVersion), then 4 zero bytes
//   16  the key (32 bytes)
//   48  payload size (u64), at most kMaxCachePayloadBytes
//   56  CRC-32C of bytes 0..55 followed by the payload (u32), then 4 zero bytes
//   64  payload: the plugin's serialized executable
// The key is SHA-256 of the StableHLO text, the compile options and the plugin's identity
// (compile_cache_key), so a file is found only by the program it was compiled from.
//
// Trust: a payload is machine code the plugin will run. The checks here (size limits, checksum,
// key) catch accidents — a torn or truncated write, a flipped bit, a file copied under another
// name — not an adversary, who can write a well-formed entry. What keeps others' code out is
// ownership: the folder must be a directory owned by this user and writable by no one else
// (fulgur creates it with mode 0700), and an entry is read only when it is a regular file (not a
// symbolic link) owned by this user and writable by no one else. A folder that fails the check
// turns the cache off with one warning; an entry that fails any check is ignored with one
// warning, compiled again and overwritten.
//
// Several processes (ranks, stages) share a folder: an entry is written to a temporary file in
// the folder, flushed to disk and renamed over the entry's name, so a reader sees a whole entry
// or none, and of two writers of one key the last rename wins with a whole entry.
//
// Thread safety: the functions and CompileCache's methods may be called from any thread.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "runtime/sha256.h"

namespace fulgur::xla::pjrt {

using CacheKey = runtime::Sha256Digest;

constexpr uint32_t kCacheFormatVersion = 1;
constexpr size_t kCacheHeaderBytes = 64;
// Larger than any executable fulgur compiles (the MNIST CNN's step is a few MB on the CPU
// plugin); a header that claims more is corrupt, and is refused before anything is allocated.
constexpr uint64_t kMaxCachePayloadBytes = uint64_t{1} << 30;

// SHA-256 over each part, each preceded by its length, so that no two different triples give
// the same hashed bytes.
CacheKey compile_cache_key(std::string_view program, std::string_view compile_options,
                           std::string_view plugin_identity);

// The bytes of an entry holding `payload` under `key`.
std::string encode_cache_entry(const CacheKey& key, std::string_view payload);

// The payload of `entry` (a view into it) when it is one whole entry of this format, its
// checksum right and its key `key`; otherwise nullopt, with `why` (when not null) saying what is
// wrong: "not a compile cache entry (bad magic)", "format version 7, this fulgur reads 1",
// "truncated: ...", "checksum mismatch", "written under another key (...)".
std::optional<std::string_view> decode_cache_entry(std::string_view entry, const CacheKey& key, std::string* why);

// The cache folder of this process: FULGUR_XLA_CACHE_DIR when it is set ("off": none), else the
// default a Trainer's worker sets (set_default_compile_cache_dir), else none.
std::optional<std::string> compile_cache_dir();

// The folder compile_cache_dir() gives when FULGUR_XLA_CACHE_DIR is unset; "" for none. A
// Trainer sets <default_root_dir>/.xla_cache in each worker while its stage runs.
void set_default_compile_cache_dir(const std::string& dir);

// One cache folder. Errors of the file system are never thrown: a failed read is a miss, a
// failed write leaves no entry; each warns (see the trust note above for what else warns).
class CompileCache {
 public:
  // The folder `dir`, created (mode 0700, with its parents) when missing. usable() is false, with
  // one warning per process and folder, when it cannot be created, is not a directory, or is not
  // owned by this user and writable by this user only.
  explicit CompileCache(std::string dir);

  bool usable() const { return usable_; }
  const std::string& dir() const { return dir_; }
  std::string entry_path(const CacheKey& key) const;

  // The payload of key's entry; nullopt when there is none (quietly) or when the entry fails a
  // check (one warning, counted as rejected). REQUIRES: usable().
  std::optional<std::string> load(const CacheKey& key) const;

  // Writes key's entry atomically (see above), replacing any; false (with a warning) if it could
  // not be written. REQUIRES: usable().
  bool store(const CacheKey& key, std::string_view payload) const;

  // Warns once that key's entry was refused for `why` (the caller's reason, e.g. the plugin could
  // not load it) and counts it as rejected; the next store() replaces it.
  void reject(const CacheKey& key, const std::string& why) const;

 private:
  std::string dir_;
  bool usable_ = false;
};

}  // namespace fulgur::xla::pjrt
