// SPDX-License-Identifier: Apache-2.0
#pragma once
// What LightningModule::log recorded during one stage: the latest per-step
// values and the running epoch aggregates. Values stay tensors until read, so
// logging costs no host sync inside the step (on xla devices the value is
// computed by its step's graph and read from there later).

#include <fulgur/types.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

namespace fulgur::detail {

struct LoggedValue {
  LogOptions options;  // on_step / on_epoch resolved
  at::Tensor last;     // latest value (detached)
  at::Tensor epoch;    // running sum of value * weight, or running max/min
  double weight = 0;   // sum of weights (mean only)
  bool fresh = false;  // logged since the last step read
};

class ResultCollection {
 public:
  // A logged value and where it goes.
  struct Logged {
    at::Tensor value;
    bool logger;
    bool prog_bar;
  };
  using Reducer = std::function<at::Tensor(const at::Tensor&, const std::string& op)>;

  // Clears everything (start of a stage or epoch).
  void reset() { values_.clear(); }
  // Records a value. `in_training` picks Lightning's defaults for on_step/on_epoch.
  // Throws std::invalid_argument for a non-scalar value or an unknown reduce_fx.
  void log(const std::string& name, const at::Tensor& value, LogOptions options, bool in_training,
           int64_t batch_size, const Reducer& reduce);
  // Step values logged since the last call, named "<name>_step" when the value
  // is also aggregated per epoch. Marks them read.
  std::map<std::string, Logged> take_step_values();
  // Epoch aggregates ("<name>_epoch" when also logged per step, plus "<name>").
  // Collective when a value has sync_dist: every rank must call.
  std::map<std::string, Logged> epoch_values(const Reducer& reduce) const;
  bool empty() const { return values_.empty(); }

 private:
  std::map<std::string, LoggedValue> values_;
};

// Reads the values to doubles (one host sync each).
std::map<std::string, double> to_doubles(const std::map<std::string, ResultCollection::Logged>& values);

}  // namespace fulgur::detail
