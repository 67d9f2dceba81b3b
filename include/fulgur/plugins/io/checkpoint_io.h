// SPDX-License-Identifier: Apache-2.0
#pragma once
// CheckpointIO: how a checkpoint dict becomes a file and back.

#include <fulgur/checkpoint.h>

#include <ATen/core/ivalue.h>

#include <map>
#include <string>

namespace fulgur {

// Extra settings for a storage backend; the built-in IOs accept none.
using StorageOptions = std::map<std::string, std::string>;

class CheckpointIO {
 public:
  virtual ~CheckpointIO() = default;
  virtual void save_checkpoint(const Checkpoint& checkpoint, const std::string& path,
                               const StorageOptions& storage_options = {}) = 0;
  // Throws std::runtime_error naming the file when it is missing, truncated or corrupt.
  virtual Checkpoint load_checkpoint(const std::string& path) = 0;
  virtual void remove_checkpoint(const std::string& path) = 0;
};

// torch.save's zip format (Python's torch.load reads it). Writes are atomic:
// a temporary file in the same folder, fsync, rename, fsync of the folder,
// so a crash leaves either the old complete file or the new complete one.
class TorchCheckpointIO : public CheckpointIO {
 public:
  void save_checkpoint(const Checkpoint& checkpoint, const std::string& path,
                       const StorageOptions& storage_options = {}) override;
  Checkpoint load_checkpoint(const std::string& path) override;
  void remove_checkpoint(const std::string& path) override;
  // Removes temporary files a crashed save left in `folder`; returns how many.
  static int remove_stale_temporaries(const std::string& folder);
};

// The XLA variant: tensors are moved to the CPU before writing, and
// storage_options are refused.
class XLACheckpointIO : public TorchCheckpointIO {
 public:
  void save_checkpoint(const Checkpoint& checkpoint, const std::string& path,
                       const StorageOptions& storage_options = {}) override;
};

// A copy of `value` with every tensor inside moved to the CPU.
c10::IValue to_cpu(const c10::IValue& value);

}  // namespace fulgur
