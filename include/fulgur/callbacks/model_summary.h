// SPDX-License-Identifier: Apache-2.0
#pragma once
// ModelSummary: at the start of fit, global rank 0 prints a table of the
// model's top-level submodules (name, type, parameter count) and the totals,
// through fulgur's messages on stderr (Lightning's ModelSummary callback with
// max_depth=1). One is added automatically when
// TrainerOptions::enable_model_summary is on (the default).
//
// Example of what it prints:
//   fulgur:   | Name | Type   | Params
//   fulgur: ------------------------------
//   fulgur: 0 | fc1  | Linear | 672
//   fulgur: 1 | fc2  | Linear | 132
//   fulgur: ------------------------------
//   fulgur: 804       Trainable params
//   fulgur: 0         Non-trainable params
//   fulgur: 804       Total params
//   fulgur: 0.003     Total estimated model params size (MB)

#include <fulgur/callbacks/callback.h>

#include <cstdint>
#include <string>
#include <vector>

namespace torch::nn {
class Module;
}  // namespace torch::nn

namespace fulgur {

struct ModelSummaryRow {
  std::string name;  // as registered
  std::string type;  // the module's name(), "torch::nn::LinearImpl" shown as "Linear"
  int64_t params = 0;  // elements of its parameters, its own submodules' included
};

struct ModelSummaryTable {
  std::vector<ModelSummaryRow> rows;  // the direct submodules, in registration order
  int64_t trainable_params = 0;       // elements of parameters with requires_grad
  int64_t non_trainable_params = 0;
  double size_mb = 0;  // bytes of all parameters (their own dtypes) / 1e6
  int64_t total_params() const { return trainable_params + non_trainable_params; }
};

// The table of `module`. Parameters held by the module itself (not by a
// submodule) count in the totals but have no row.
ModelSummaryTable summarize(const torch::nn::Module& module);

// The lines printed for `table` (without the "fulgur: " prefix).
std::vector<std::string> format_summary(const ModelSummaryTable& table);

class ModelSummary : public Callback {
 public:
  std::string state_key() const override { return "ModelSummary"; }
  // Rank 0 prints format_summary(summarize(model)) at level info.
  void on_fit_start(Trainer& trainer, LightningModule& model) override;
};

}  // namespace fulgur
