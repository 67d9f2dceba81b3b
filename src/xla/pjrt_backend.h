// SPDX-License-Identifier: Apache-2.0
#pragma once
// The torch::lazy backend on PJRT (FULGUR_XLA_BACKEND=pjrt): a BackendImplInterface that wraps
// libtorch's TorchScript backend. The TS lowering makes each graph; the graph is typed from the
// lazy nodes' shapes and the parameters' data, emitted as StableHLO (xla/stablehlo/emitter.h)
// and compiled by the process's PJRT client. A graph with an op the emitter does not know keeps
// its TorchScript computation (a fallback, counted by op kind and warned about once per kind).
//
// Device data are PJRT buffers: a tensor is uploaded once when it becomes device data, graphs
// take and give buffers, and a value is downloaded only when the host reads it (.cpu(), item(),
// an op that runs eagerly, a graph that fell back to TorchScript, gradient sync, checkpoints).

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "xla/stablehlo/emitter.h"

namespace fulgur::xla {

struct PjrtBackendMetrics {
  int64_t graphs_compiled = 0;   // graphs compiled by XLA or loaded from the compile cache
  double compile_seconds = 0;    // emission + PJRT compile (or cache load) of those graphs
  int64_t executions = 0;        // graphs run by XLA
  int64_t bytes_to_device = 0;   // host -> device: tensors made device data, numbers each run
  int64_t bytes_to_host = 0;     // device -> host: values the host read
  int64_t graphs_fallen_back = 0;    // graphs kept on TorchScript (counted when compiled)
  int64_t fallback_executions = 0;  // runs of those graphs
  // Convolutions run libtorch's kernels inside the compiled programs (FULGUR_XLA_HOST_KERNELS, or
  // its default on the CPU plugin); decided at the first compile, false before it.
  bool host_convolutions = false;
  // Values moved in one copy between a PJRT buffer and a caller's host tensor (the gradient
  // sync): copy_device_value_to_host calls that copied, device_tensor_from_host calls.
  int64_t one_copy_to_host = 0;
  int64_t one_copy_to_device = 0;
  // Arguments an execution took over for the result aliased to them, and their bytes.
  int64_t buffers_donated = 0;
  int64_t bytes_donated = 0;
  // Per op kind (or reason) that kept a graph on TorchScript: the number of such graphs compiled
  // (a graph the lazy core's cache holds is counted once, however often it runs).
  std::map<std::string, int64_t> fallbacks;
};

// Initializes the TorchScript backend and registers the PJRT one over it. Idempotent.
void install_pjrt_lazy_backend();
PjrtBackendMetrics pjrt_backend_metrics();

// Gradient sync in one copy each way (StepReducer):
// Copies the value of `tensor`, a lazy tensor whose data is a PJRT buffer with no pending graph
// (a gradient after the step mark), into `dst` with one device-to-host copy and returns true.
// Returns false and copies nothing for any other tensor (the caller copies another way). Throws
// std::invalid_argument if `dst` is not a contiguous CPU tensor of the value's dtype and size.
bool copy_device_value_to_host(const at::Tensor& tensor, const at::Tensor& dst);
// A lazy tensor on `device` whose data is a new PJRT buffer holding `host`'s values (one copy;
// `host` may change afterwards). REQUIRES: install_pjrt_lazy_backend() ran (the xla backend is
// "pjrt").
at::Tensor device_tensor_from_host(const at::Tensor& host, const c10::Device& device);

namespace detail {

// What the backend's Compile does with one lowered graph: emits it, and, when every op has a
// lowering, hands the emission to `compile` (PJRT's compile in the backend). Returns the ops
// (with their reasons) that keep the graph on TorchScript, empty once compiled. A failure of the
// emitter or of `compile` is not a reason to fall back: it throws std::runtime_error saying which
// failed, with its message and the graph.
std::vector<std::string> emit_then_compile(const torch::jit::Graph& graph, const stablehlo::EmitOptions& options,
                                           const std::vector<stablehlo::Alias>& aliases,
                                           const std::function<void(const stablehlo::Emission&)>& compile);

}  // namespace detail

}  // namespace fulgur::xla
