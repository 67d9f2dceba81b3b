// SPDX-License-Identifier: Apache-2.0
#pragma once
// Logger: where metrics go. Only global rank 0 calls a logger.

#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>

#include <cstdint>
#include <map>
#include <string>

namespace fulgur {

class Logger {
 public:
  virtual ~Logger() = default;
  virtual std::string name() const = 0;
  // Resolved on first use (e.g. the next free version_N).
  virtual std::string version() = 0;
  // Folder of this run's files; checkpoints go under <log_dir>/checkpoints.
  virtual std::string log_dir() = 0;
  virtual void log_metrics(const std::map<std::string, double>& metrics, int64_t step) = 0;
  virtual void log_hyperparams(const c10::Dict<std::string, c10::IValue>& hparams) = 0;
  // Writes buffered rows to disk.
  virtual void save() = 0;
  virtual void finalize(const std::string& status) = 0;
};

}  // namespace fulgur
