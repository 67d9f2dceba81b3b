#pragma once
// The torch::lazy backend on PJRT (FULGUR_XLA_BACKEND=pjrt): a BackendImplInterface that wraps
// libtorch's TorchScript backend. The TS lowering makes each graph; the graph is typed from the
// lazy nodes' shapes and the parameters' data, emitted as StableHLO (xla/stablehlo/emitter.h)
// and compiled by the process's PJRT client. A graph with an op the emitter does not know keeps
// its TorchScript computation (a fallback, counted by op kind and warned about once per kind).
// Device data stays in CPU tensors (TSData): each execution uploads its arguments and downloads
// its results.

#include <cstdint>
#include <map>
#include <string>

namespace fulgur::xla {

struct PjrtBackendMetrics {
  int64_t graphs_compiled = 0;   // graphs compiled by XLA
  double compile_seconds = 0;    // emission + PJRT compile of those graphs
  int64_t executions = 0;        // graphs run by XLA
  int64_t bytes_to_device = 0;   // arguments uploaded
  int64_t bytes_to_host = 0;     // results downloaded
  int64_t graphs_fallen_back = 0;    // graphs kept on TorchScript (counted when compiled)
  int64_t fallback_executions = 0;  // runs of those graphs
  // Per op kind (or reason) that kept a graph on TorchScript: the number of such graphs compiled
  // (a graph the lazy core's cache holds is counted once, however often it runs).
  std::map<std::string, int64_t> fallbacks;
};

// Initializes the TorchScript backend and registers the PJRT one over it. Idempotent.
void install_pjrt_lazy_backend();
PjrtBackendMetrics pjrt_backend_metrics();

}  // namespace fulgur::xla
