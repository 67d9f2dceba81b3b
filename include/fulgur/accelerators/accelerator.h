// SPDX-License-Identifier: Apache-2.0
#pragma once
// Accelerator: which devices exist and what a device is.

#include <c10/core/Device.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace fulgur {

class Accelerator {
 public:
  virtual ~Accelerator() = default;
  // "cpu", "cuda" or "xla".
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
  // Statistics of `device` by name, as Lightning's get_device_stats (DeviceStatsMonitor logs
  // them). Here, the host's: cpu_percent (all cores, since the previous call in this process),
  // cpu_vm_percent and cpu_swap_percent (memory and swap in use), process_rss_bytes and
  // process_peak_rss_bytes (this process's resident memory, now and at its peak), read from
  // /proc. Empty where /proc cannot be read.
  virtual std::map<std::string, double> get_device_stats(const c10::Device& device) const;
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
  // XLA_NUM_DEVICES if set (a positive integer); else, with PJRT_DEVICE=CUDA or TPU or a
  // PJRT_LIBRARY_PATH plugin, the plugin's addressable devices (counted in a child process);
  // else (the CPU plugin) the number of cores.
  int64_t auto_device_count() const override;
  int64_t max_device_count() const override;
  // The xla device of this process (each process owns one).
  c10::Device device(int64_t index) const override;
  // Starts the xla backend of this process (once).
  void setup_device(const c10::Device& device) override;
  void teardown() override;
  // The device's allocator statistics from the PJRT plugin, in bytes (bytes_in_use,
  // peak_bytes_in_use, bytes_limit... as the plugin gives them); on a plugin without them (the
  // CPU plugin, whose device memory is the host's), the host's statistics.
  std::map<std::string, double> get_device_stats(const c10::Device& device) const override;
};

// NVIDIA GPUs through libtorch's CUDA (a libtorch with libtorch_cuda; see
// cmake/FulgurLibtorch.cmake). Device index i is cuda:i as the CUDA runtime
// numbers the devices CUDA_VISIBLE_DEVICES leaves visible. One process per
// GPU: rank k of a node owns the k-th device of `devices`.
class CUDAAccelerator : public Accelerator {
 public:
  std::string name() const override { return "cuda"; }
  // Every visible CUDA device, as Lightning's CUDAAccelerator.
  int64_t auto_device_count() const override { return max_device_count(); }
  int64_t max_device_count() const override;
  c10::Device device(int64_t index) const override { return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(index)); }
  // Makes `device` this thread's current CUDA device and gives its generator
  // the seed of seed_everything, if any. Throws naming the device when it is
  // not a visible CUDA device, and explaining the cause when CUDA cannot start
  // in a forked worker because the launching process had started it.
  void setup_device(const c10::Device& device) override;
};

// The number of CUDA devices this process may use (CUDA_VISIBLE_DEVICES
// applied), counted without initializing CUDA in this process: a child
// process counts them, so that workers forked after the count still get a
// working CUDA. 0 when the libtorch fulgur is linked with has no CUDA, or
// no driver or device answers. Counted once per process.
int64_t cuda_device_count();
// Why cuda_device_count() is 0, in words for an error message ("" when it is not).
std::string cuda_unavailable_reason();

namespace detail {
// seed_everything's CUDA part: each CUDA device's default generator takes `seed` when
// CUDAAccelerator::setup_device starts that device in this process, or now for the devices it
// already started. Nothing here starts CUDA.
void seed_cuda_generators(uint64_t seed);
}  // namespace detail

// "cpu", "cuda" (or its alias "gpu"), "xla", or "auto": cuda when CUDA
// devices are visible, else xla (every machine has the lazy backend).
// make_strategy resolves "auto" against the strategy first (see registry.h).
// Throws std::invalid_argument listing the valid names, and for "cuda" when
// no CUDA device is visible, saying why.
std::shared_ptr<Accelerator> make_accelerator(const std::string& name);

// Resolves the user's `devices` against an accelerator: an int N (the first
// N devices), "auto", "N", a list "0,2", or explicit indices. Throws
// std::invalid_argument naming the value and what is allowed for 0,
// negatives, more than exist, duplicates or junk. -1 is a negative like any
// other, on every accelerator (not Lightning's "all devices": say "auto").
std::vector<int64_t> parse_devices(const std::string& spec, const Accelerator& accelerator);

}  // namespace fulgur
