// SPDX-License-Identifier: Apache-2.0
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
//                 reach the float32 parameters as float32. On CUDA devices
//                 the same, with CUDA autocast; on xla devices with fulgur's
//                 autocast of lazy tensors (XLAPrecision, xla.h), whose casts
//                 are ops of the compiled graph.
//   "16-mixed"    float16 autocast on CUDA devices (Lightning's MixedPrecision):
//                 float32 parameters, the steps' forward under CUDA autocast to
//                 float16, and a GradScaler (grad_scaler.h) that scales the
//                 loss before backward, unscales the gradients after the sync
//                 across ranks and before clipping, skips the steps whose
//                 gradients overflowed, and is saved in checkpoints under
//                 "MixedPrecision" (Lightning's key). CUDA only.

#include <fulgur/plugins/precision/grad_scaler.h>
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
  // "32-true", "bf16-true", "bf16-mixed" or "16-mixed" (see validate_precision).
  explicit Precision(std::string name = "32-true");
  virtual ~Precision() = default;
  const std::string& name() const { return name_; }
  // The parameters' and inputs' dtype: bfloat16 for bf16-true, else float32.
  c10::ScalarType dtype() const;
  // The dtype autocast lowers ops to in the steps (bfloat16 for bf16-mixed,
  // float16 for 16-mixed), or nullopt: no autocast.
  std::optional<c10::ScalarType> autocast_dtype() const;
  // Whether the steps' devices must be CUDA devices (16-mixed).
  bool needs_cuda() const { return name_ == "16-mixed"; }
  // Whether ForwardContext also autocasts lazy (xla) tensors: XLAPrecision's
  // answer for bf16-mixed (xla.h); false here.
  virtual bool autocasts_xla_tensors() const { return false; }
  // The loss that backward runs from: loss * the scaler's scale for 16-mixed, else `loss`.
  virtual at::Tensor pre_backward(const at::Tensor& loss) const;
  // After the gradients are synced across ranks and before clipping: divides
  // them by the scaler's scale (16-mixed; nothing for the others).
  virtual void unscale_gradients(torch::optim::Optimizer& optimizer) const;
  // The scaler of 16-mixed, else null.
  GradScaler* scaler() const { return scaler_.get(); }
  // What a checkpoint keeps of this plugin under checkpoint_key() (the
  // scaler's state for 16-mixed), or nullopt: nothing.
  std::optional<c10::Dict<std::string, c10::IValue>> state_dict() const;
  void load_state_dict(const c10::Dict<std::string, c10::IValue>& state, const std::string& where) const;
  // Lightning's key for this plugin's state: its class name, "MixedPrecision".
  static const char* checkpoint_key() { return "MixedPrecision"; }
  // Converts floating-point parameters and buffers to dtype().
  virtual void convert_module(torch::nn::Module& module) const;
  // Converts floating-point inputs to dtype(); integer targets stay.
  virtual Batch convert_input(const Batch& batch) const;
  // Lightning's Precision.optimizer_step: runs closure (forward and
  // backward), then before_step (what Strategy::optimizer_step puts between
  // backward and the update: its gradient sync across ranks, then
  // unscale_gradients, the trainer's on_before_optimizer_step and clipping),
  // then update(optimizer); with a scaler the update is skipped when the
  // gradients overflowed, and the scale is updated after it.
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
  std::shared_ptr<GradScaler> scaler_;
};

// Lightning's Precision.forward_context(): while alive, the ops run on this
// thread are autocast as `precision` asks (CPU autocast to bfloat16 for
// bf16-mixed, and lazy tensors' when precision.autocasts_xla_tensors();
// nothing for the others). Nests; the destructor restores the
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
  bool xla_ = false;  // lazy tensors autocast too; the three below restore it
  bool was_xla_included_ = false, was_xla_enabled_ = false;
  c10::ScalarType previous_xla_dtype_ = c10::kBFloat16;
  bool was_cpu_enabled_ = false;
  bool was_cuda_enabled_ = false;
  c10::ScalarType previous_cpu_dtype_ = c10::kBFloat16;
  c10::ScalarType previous_cuda_dtype_ = c10::kHalf;
};

// The full name of `name` ("32" is "32-true", "bf16" is "bf16-mixed", "16" is
// "16-mixed", as in Lightning). Throws std::invalid_argument naming it and
// listing "32-true", "bf16-mixed", "bf16-true", "16-mixed" for anything else,
// with the reason for "16-true" (float16 weights and inputs are not
// implemented by fulgur yet). "16-mixed" needs CUDA devices: the strategies
// refuse it elsewhere (check_precision_device).
std::string validate_precision(const std::string& name);

// Throws std::invalid_argument when `precision` cannot run on `device`:
// 16-mixed (float16 autocast) on anything but a CUDA device, as Lightning
// refuses it on the CPU; the message names both and what to use instead.
void check_precision_device(const Precision& precision, const c10::Device& device);

}  // namespace fulgur
