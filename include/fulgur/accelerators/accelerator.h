#pragma once
// Accelerator: which devices exist and what a device is.

#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace fulgur {

class Accelerator {
 public:
  virtual ~Accelerator() = default;
  // "cpu" or "xla".
  virtual std::string name() const = 0;
  // Devices used when the user says devices="auto".
  virtual int64_t auto_device_count() const = 0;
  // The most devices this machine offers (indices 0..max-1).
  virtual int64_t max_device_count() const = 0;
  // The device of index `index` as this process sees it.
  virtual c10::Device device(int64_t index) const = 0;
  // Called once inside each worker before any tensor touches the device.
  virtual void setup_device(const c10::Device& device) = 0;
  virtual void teardown() {}
};

class CPUAccelerator : public Accelerator {
 public:
  std::string name() const override { return "cpu"; }
  // 1, as in Lightning: several cpu "devices" are processes, asked for explicitly.
  int64_t auto_device_count() const override { return 1; }
  int64_t max_device_count() const override;
  c10::Device device(int64_t index) const override;
  void setup_device(const c10::Device& device) override;
};

class XLAAccelerator : public Accelerator {
 public:
  std::string name() const override { return "xla"; }
  // XLA_NUM_DEVICES if set (a positive integer), else the number of cores.
  int64_t auto_device_count() const override;
  int64_t max_device_count() const override;
  // The xla device of this process (each process owns one).
  c10::Device device(int64_t index) const override;
  // Starts the xla backend of this process (once).
  void setup_device(const c10::Device& device) override;
  void teardown() override;
};

// "cpu", "xla" or "auto" (xla: every machine has the lazy backend).
// Throws std::invalid_argument listing the valid names.
std::shared_ptr<Accelerator> make_accelerator(const std::string& name);

// Resolves the user's `devices` against an accelerator: an int N (the first
// N devices), "auto", "N", a list "0,2", or explicit indices. Throws
// std::invalid_argument naming the value and what is allowed for 0,
// negatives, more than exist, duplicates or junk. -1 is a negative like any
// other, on every accelerator (not Lightning's "all devices": say "auto").
std::vector<int64_t> parse_devices(const std::string& spec, const Accelerator& accelerator);

}  // namespace fulgur
