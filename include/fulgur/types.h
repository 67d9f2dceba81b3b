// SPDX-License-Identifier: Apache-2.0
#pragma once
// Small value types shared by the whole API: the batch, what a step returns,
// how a value is logged, and the training stage.

#include <ATen/core/Tensor.h>
#include <torch/arg.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>

namespace fulgur {

// A batch: inputs in `data`, labels (or next tokens) in `target`.
// Both tensors have the batch as their first dimension. (A struct of its own:
// torch::data::Example, the same two fields, brings all of ATen's operators
// into every file that includes this header.)
struct Batch {
  Batch() = default;
  Batch(at::Tensor data, at::Tensor target) : data(std::move(data)), target(std::move(target)) {}
  at::Tensor data;
  at::Tensor target;
};

// What a *_step returns: nothing, a loss tensor, or a dict that holds "loss"
// (and anything else the user wants to pass to the *_batch_end hooks).
//
// Example:
//   return loss;                               // a tensor
//   return StepOutput({{"loss", loss}, {"acc", acc}});
class StepOutput {
 public:
  StepOutput() = default;
  StepOutput(at::Tensor loss);  // NOLINT(google-explicit-constructor): mirrors Lightning
  explicit StepOutput(std::map<std::string, at::Tensor> values);

  bool empty() const { return values_.empty(); }
  bool has_loss() const { return values_.count("loss") > 0; }
  // REQUIRES: has_loss().
  const at::Tensor& loss() const;
  const std::map<std::string, at::Tensor>& values() const { return values_; }

 private:
  std::map<std::string, at::Tensor> values_;
};

enum class Stage { kFit, kValidate, kTest, kPredict, kSanityCheck };
const char* to_string(Stage stage);

// How `LightningModule::log` records a value. Unset fields take Lightning's
// defaults for the hook they are called from: in training_step
// on_step=true, on_epoch=false; in validation/test steps on_step=false,
// on_epoch=true.
//
// Example:
//   log("train_loss", loss, fulgur::LogOptions().prog_bar(true));
//   log("val_acc", acc, fulgur::LogOptions().sync_dist(true).on_step(false));
struct LogOptions {
  TORCH_ARG(std::optional<bool>, on_step) = std::nullopt;
  TORCH_ARG(std::optional<bool>, on_epoch) = std::nullopt;
  // Show the value in the progress bar.
  TORCH_ARG(bool, prog_bar) = false;
  // Send the value to the logger (metrics.csv).
  TORCH_ARG(bool, logger) = true;
  // Reduce the value across ranks (one collective per logged value).
  TORCH_ARG(bool, sync_dist) = false;
  // How on_epoch values are aggregated over the epoch: "mean", "sum", "max", "min".
  TORCH_ARG(std::string, reduce_fx) = "mean";
  // Weight of this value in the epoch mean; default: the batch's first dimension.
  TORCH_ARG(std::optional<int64_t>, batch_size) = std::nullopt;
  // The value is logged from global rank 0 only (as Lightning's
  // rank_zero_only=True): calls on other ranks are ignored, so those ranks'
  // callbacks cannot monitor it. Cannot be combined with sync_dist, whose
  // collective the other ranks would never join.
  TORCH_ARG(bool, rank_zero_only) = false;
};

}  // namespace fulgur
