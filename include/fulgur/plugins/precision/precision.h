#pragma once
// Precision: the numeric format of training: module conversion, input
// conversion, the context of the model's steps and the optimizer step.
//
//   "32-true"     float32 throughout.
//   "bf16-true"   parameters and floating-point inputs converted to bfloat16.
//   "bf16-mixed"  Lightning's CPU mixed precision: float32 parameters (the
//                 master weights), inputs as given, and each step's forward
//                 under CPU autocast to bfloat16, so that the ops autocast
//                 lowers (matmul, linear, conv, bmm, ...) run in bfloat16 and
//                 the ones it keeps in float32 (losses, softmax, norms, ...)
//                 stay there. The backward runs outside autocast; gradients
//                 reach the float32 parameters as float32. CPU only.

#include <fulgur/types.h>

#include <c10/core/ScalarType.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>

namespace torch {
namespace nn {
class Module;
}  // namespace nn
namespace optim {
class Optimizer;
}  // namespace optim
}  // namespace torch

namespace fulgur {

class Precision {
 public:
  // "32-true", "bf16-true" or "bf16-mixed" (see validate_precision).
  explicit Precision(std::string name = "32-true");
  virtual ~Precision() = default;
  const std::string& name() const { return name_; }
  // The parameters' and inputs' dtype: bfloat16 for bf16-true, else float32.
  c10::ScalarType dtype() const;
  // The dtype autocast lowers ops to in the steps (bfloat16 for bf16-mixed), or nullopt: no autocast.
  std::optional<c10::ScalarType> autocast_dtype() const;
  // Converts floating-point parameters and buffers to dtype().
  virtual void convert_module(torch::nn::Module& module) const;
  // Converts floating-point inputs to dtype(); integer targets stay.
  virtual Batch convert_input(const Batch& batch) const;
  // Lightning's Precision.optimizer_step: runs closure (forward and
  // backward), then before_step (what Strategy::optimizer_step puts between
  // backward and the update: its gradient sync across ranks, then the
  // trainer's on_before_optimizer_step and clipping), then update(optimizer).
  // `module` is the one the optimizer trains. Strategy::optimizer_step is the
  // caller; XLAPrecision (xla.h) adds a lazy device's step marks.
  virtual void optimizer_step(torch::optim::Optimizer& optimizer, const torch::nn::Module& module,
                              const std::function<void()>& closure, const std::function<void()>& before_step) const;

 protected:
  // The update: one fused pass for Adam/AdamW on CPU float32 parameters
  // (src/optim/fused_adam.h), else optimizer.step().
  static void update(torch::optim::Optimizer& optimizer);

 private:
  std::string name_;
};

// Lightning's Precision.forward_context(): while alive, the ops run on this
// thread are autocast as `precision` asks (CPU autocast to bfloat16 for
// bf16-mixed; nothing for the others). Nests; the destructor restores the
// autocast state it found. The strategies hold one around each
// training/validation/test/predict step.
class ForwardContext {
 public:
  explicit ForwardContext(const Precision& precision);
  ~ForwardContext();
  ForwardContext(const ForwardContext&) = delete;
  ForwardContext& operator=(const ForwardContext&) = delete;

 private:
  bool active_ = false;
  bool was_enabled_ = false;
  c10::ScalarType previous_dtype_ = c10::kBFloat16;
};

// The full name of `name` ("32" is "32-true", "bf16" is "bf16-mixed", as in
// Lightning). Throws std::invalid_argument naming it and listing "32-true",
// "bf16-mixed", "bf16-true" for anything else, with the reason for the 16-bit
// ones: "16-mixed" ("16") is float16 autocast, which Lightning allows only on
// a GPU; "16-true" (float16 weights and inputs) is not implemented by fulgur yet.
std::string validate_precision(const std::string& name);

}  // namespace fulgur
