// SPDX-License-Identifier: Apache-2.0
#pragma once
// Training a zoo model (tests/zoo/models.h) with the Trainer and the checks every zoo model
// passes on xla; shared by the zoo's test files.

#include "zoo/models.h"

#include <fulgur/xla/backend.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace fulgur::zoo {

struct Run {
  at::Tensor losses;
  at::Tensor parameters;  // every parameter and buffer, flattened, on the CPU
  Metrics metrics;        // what the model logged (the last step's values)
};

// Fits `model` 20 steps on `accelerator` (one device), batches of 8 shuffled with seed 11,
// `clip` as gradient_clip_val, with `precision`.
Run train(Recording& model, const std::string& accelerator, std::shared_ptr<TensorDataset> data,
          std::optional<double> clip, const std::string& precision = "32-true");

// What left XLA since `before`: graphs kept on TorchScript by op, ops run on the host. Reading
// a logged value back (item(), aten::_local_scalar_dense: a copy of a computed value, not an op)
// is allowed `reads` times in all: the Trainer reads each logged metric when the fit ends, not
// at every step. Empty when nothing left.
std::string left_xla(const xla::BackendMetrics& before, int64_t reads);

// Graphs compiled after warm-up: the count when the last step began minus the count when step
// kWarmUp began.
int64_t graphs_after_warm_up(const Recording& model);

// Trains `make(0)` on cpu and on xla (the same initial weights) and compares losses, parameters
// and the `logged` metrics; then `make(p)` on xla with dropout on, which must stay on XLA too.
// Both xla runs must stop compiling new graphs after warm-up. Reports failures through gtest.
void check_model(const std::function<std::shared_ptr<Recording>(double)>& make, std::shared_ptr<TensorDataset> data,
                 std::optional<double> clip, double p, const std::vector<std::string>& logged = {});

}  // namespace fulgur::zoo
