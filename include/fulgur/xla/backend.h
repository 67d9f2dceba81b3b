// SPDX-License-Identifier: Apache-2.0
#pragma once
// The device backend behind `xla` devices. One per process, started by
// XLAAccelerator::setup_device. The eager backend runs xla devices as plain
// CPU tensors; the lazy backend (torch::lazy, TorchScript) records
// operations into graphs that a step mark compiles (cached) and runs.

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace fulgur::xla {

// Counters of the backend, cumulative over the life of the process (they
// survive Backend::reset()). The eager backend reports zeros.
struct BackendMetrics {
  int64_t graphs_compiled = 0;  // graphs compiled (torch::lazy UncachedCompile)
  int64_t cache_hits = 0;       // graph executions found in the compile cache (CachedCompile)
  int64_t mark_steps = 0;       // calls of Backend::mark_step
  // Ops that ran eagerly on the CPU outside the graph, with their call counts
  // ("aten::nonzero" -> 3). "aten::_local_scalar_dense" comes from item().
  std::map<std::string, int64_t> eager_fallbacks;
  // Wall time of mark_step calls that compiled a graph (execution included),
  // and of the ones that did not. Work synced outside mark_step (item(),
  // .to(kCPU) of a pending tensor) is not timed.
  double compile_seconds = 0.0;
  double execute_seconds = 0.0;
  // FULGUR_XLA_BACKEND=pjrt only (zeros otherwise): graphs compiled by XLA (or loaded from the
  // compile cache; the metrics report has the PJRT compiles), the time of their StableHLO
  // emission and PJRT compile or cache load, graphs run by XLA, bytes of arguments uploaded and of
  // results downloaded, and the graphs kept on TorchScript because of an op (or reason) the
  // StableHLO emitter does not handle, by op kind ("aten::cos" -> 2; a graph counts once when it
  // is compiled, not at each run), and the runs of such graphs on TorchScript.
  int64_t xla_graphs_compiled = 0;
  double xla_compile_seconds = 0.0;
  int64_t xla_executions = 0;
  // Floating-point operations of the programs XLA ran, by XLA's cost analysis of each compiled
  // program (two per multiply-add), summed over their executions; and the executions of
  // programs whose plugin gave no cost analysis (not in the sum).
  double xla_executed_flops = 0.0;
  int64_t xla_executions_without_flops = 0;
  int64_t bytes_to_device = 0;
  int64_t bytes_to_host = 0;
  std::map<std::string, int64_t> xla_fallbacks;
  int64_t ts_fallback_executions = 0;
  // Convolutions run libtorch's CPU kernels inside the compiled programs instead of XLA's own
  // (FULGUR_XLA_HOST_KERNELS; decided at the first compile).
  bool xla_host_convolutions = false;
  // Arguments whose buffers an execution took over for a result (a parameter or optimizer
  // state the step updates, nothing else holding its old value), and their bytes: memory XLA
  // reused in place instead of allocating the result.
  int64_t xla_buffers_donated = 0;
  int64_t xla_bytes_donated = 0;
};

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
  // Whether the optimizer's update may be traced into the graph of the forward and backward (one
  // graph per step): true where a graph compiler fuses them (pjrt). The TorchScript backend runs
  // the forward and backward as a graph of their own before the update, which was faster there.
  virtual bool update_joins_backward_graph() const { return false; }
  // Copies the value of `tensor`, a tensor of this backend's device with no pending graph (a
  // gradient after the step mark), into `dst`, a contiguous CPU tensor of its dtype and element
  // count. Default: through a CPU copy of `tensor`; pjrt: one copy out of its device buffer.
  virtual void copy_to_host(const at::Tensor& tensor, const at::Tensor& dst) const;
  // A tensor on `device` (this backend's) holding `host`'s values in storage of its own: `host`
  // may change afterwards. Default: a copy moved to the device; pjrt: one copy into a new buffer.
  virtual at::Tensor from_host(const at::Tensor& host, const c10::Device& device) const;
  virtual BackendMetrics metrics() const { return BackendMetrics{}; }
  // The device's allocator statistics in bytes by name (PJRT_Device_MemoryStats: bytes_in_use,
  // peak_bytes_in_use, bytes_limit... as the plugin gives them); empty for the eager and
  // TorchScript backends and for a plugin without statistics.
  virtual std::map<std::string, int64_t> device_memory_stats() const { return {}; }
  // Readable text: the numbers of metrics(), plus backend details.
  virtual std::string metrics_report() const;

 protected:
  // Lines of this backend's own counters, which metrics_report() puts after the common ones
  // (pjrt: XLA's compiles, executions, transfers, fallbacks and the compile cache); default none.
  virtual std::string backend_report() const { return {}; }

 public:
  // The inputs of the step about to be traced (the batch tensors). Only their
  // shapes and dtypes are kept; they name what changed when a graph is
  // recompiled after warm-up. Call it before the mark_step that precedes the
  // step (DeviceLoader does).
  virtual void note_inputs(const std::vector<at::Tensor>& inputs) {}
};

// The backend of this process; started on first use from FULGUR_XLA_BACKEND:
// "pjrt" (the default): torch::lazy with graphs compiled to StableHLO and run
// by the PJRT plugin PJRT_DEVICE chooses, device data in PJRT buffers;
// "ts" ("lazy" is accepted as its old name): torch::lazy on the TorchScript
// backend, kept as a reference; "eager": plain CPU tensors.
// Throws std::invalid_argument naming the valid ones for other names.
Backend& backend();
bool backend_started();
void mark_step();

// Applies the in-place updates that functionalization keeps pending for each
// of `tensors` (lazy tensors; others are skipped). libtorch 1.13 kept every
// in-place op's new value until a view of the tensor was read, so each step
// left live lazy tensors behind and mark_step slowed down step by step; fulgur
// called this once per step then. libtorch 2.x does not keep them
// (Xla.InPlaceUpdatesDoNotAccumulateLiveTensors checks the live count without
// it), and fulgur no longer calls it; it stays for programs that do.
void apply_pending_updates(const std::vector<at::Tensor>& tensors);

// These do not start the backend: before it starts, metrics() is all zeros,
// metrics_report() says so and note_inputs() does nothing.
BackendMetrics metrics();
std::string metrics_report();
void note_inputs(const std::vector<at::Tensor>& inputs);

}  // namespace fulgur::xla
