#pragma once
// Precision: the numeric format of training: module conversion, input
// conversion and the optimizer step.

#include <fulgur/types.h>

#include <c10/core/ScalarType.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <functional>
#include <memory>
#include <string>

namespace fulgur {

// The parts of an optimizer step around the update, filled by
// Strategy::optimizer_step (the only caller of Precision::optimizer_step).
struct StepHooks {
  // After the closure: a step mark on lazy devices, the strategy's gradient
  // sync across ranks, then the trainer's part (on_before_optimizer_step,
  // gradient clipping), or nothing more under manual optimization.
  std::function<void()> before_step;
  // After the update: on lazy devices the pending updates are applied; then
  // the strategy's mark_step() (a no-op except on the xla strategies).
  std::function<void()> after_step;
};

class Precision {
 public:
  // "32-true" or "bf16-true".
  explicit Precision(std::string name = "32-true");
  virtual ~Precision() = default;
  const std::string& name() const { return name_; }
  c10::ScalarType dtype() const;
  // Converts floating-point parameters and buffers to dtype().
  virtual void convert_module(torch::nn::Module& module) const;
  // Converts floating-point inputs to dtype(); integer targets stay.
  virtual Batch convert_input(const Batch& batch) const;
  // Runs closure (forward and backward), hooks.before_step, the update
  // (one fused pass for Adam/AdamW on CPU float32 parameters, see
  // src/optim/fused_adam.h, else optimizer.step()), hooks.after_step.
  virtual void optimizer_step(torch::optim::Optimizer& optimizer, const std::function<void()>& closure,
                              const StepHooks& hooks) const;

 private:
  std::string name_;
};

// The XLA precision plugin, which the xla strategies require. It behaves as
// Precision: the step mark that follows the update comes from the strategy's
// hooks.after_step, not from this class.
class XLAPrecision : public Precision {
 public:
  using Precision::Precision;
};

// Throws std::invalid_argument listing "32-true", "bf16-true" for anything else
// ("16-true": no half-precision matmul kernels on the CPU in libtorch 1.13).
std::string validate_precision(const std::string& name);

}  // namespace fulgur
