#pragma once
// The device backend behind `xla` devices. One per process, started by
// XLAAccelerator::setup_device. The eager backend runs xla devices as plain
// CPU tensors; the lazy backend (torch::lazy, TorchScript) records
// operations into graphs that a step mark compiles (cached) and runs.

#include <c10/core/Device.h>

#include <memory>
#include <string>

namespace fulgur::xla {

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual c10::Device device() const = 0;
  // Compiles (or finds in the cache) and runs the pending graph of every live
  // tensor on the device; returns when the results are ready.
  virtual void mark_step() = 0;
  // Drops cached graphs and device data.
  virtual void reset() {}
};

// The backend of this process; started on first use from FULGUR_XLA_BACKEND
// ("lazy" by default, or "eager"). Throws std::invalid_argument for other names.
Backend& backend();
bool backend_started();
void mark_step();

}  // namespace fulgur::xla
