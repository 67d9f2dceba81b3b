// SPDX-License-Identifier: Apache-2.0
#pragma once
// Moving a module's parameters and buffers to a device.

#include <c10/core/Device.h>

#include <functional>

namespace at {
class Tensor;
}  // namespace at
namespace torch::nn {
class Module;
}  // namespace torch::nn

namespace fulgur {

// Moves every parameter and buffer of `module` (recursively) to `device`,
// keeping the identity of tensors shared between submodules (tied weights
// stay tied). Works for lazy devices, where torch::nn::Module::to cannot.
//
// When neither `device` nor any tensor of the module is lazy this is
// module.to(device), which keeps the tensor objects. Otherwise every
// parameter and buffer is REPLACED by a new tensor on `device` (same
// requires_grad; an existing .grad moves too), so handles taken before the
// move (an optimizer's params, `auto w = fc->weight`) still point at the old
// tensors: build optimizers after the move. Pending lazy work on the module's
// tensors is run as one graph before copying them off the lazy device.
//
// forward() reads member handles (LinearImpl::weight, ...), not the module's
// parameter dict, so they are rebound too. This is automatic for the built-in
// modules: Linear, Bilinear, Conv1d/2d/3d, ConvTranspose1d/2d/3d,
// BatchNorm1d/2d/3d, InstanceNorm1d/2d/3d, LayerNorm, GroupNorm, Embedding,
// EmbeddingBag, PReLU, MultiheadAttention, RNN/LSTM/GRU, RNNCell/LSTMCell/
// GRUCell, NLLLoss/CrossEntropyLoss/BCEWithLogitsLoss (class weights) and
// FractionalMaxPool2d/3d. Containers (Sequential, ModuleList, ModuleDict,
// ParameterList, ParameterDict) hold no member handles. Every one of them runs
// forward and backward on xla and matches eager (tests/test_modules.cpp, the
// module matrix, each in a child process: RNN/LSTM/GRU with 1 and 2 layers,
// batch_first, bidirectional, with and without an initial state). All of
// their forward and backward compiles with XLA except: ConvTranspose1d/2d/3d
// (the transposed convolution runs on the TorchScript backend),
// InstanceNorm1d/2d/3d (its aten::repeat does), PReLU and EmbeddingBag (their
// kernels run on the host: the lazy core has no node for them),
// FractionalMaxPool2d/3d (its sampling on TorchScript, the pool on the host)
// and MultiheadAttention (its aten::equal check of query against key runs on
// the host; the attention itself compiles). The test prints this per module;
// fulgur::xla::metrics_report() names such ops in any run. None is refused and
// none aborts. The dropout modules (Dropout, Dropout2d/3d, AlphaDropout,
// FeatureAlphaDropout) hold no tensors, so need no mover; they draw their
// masks on the device and compile with XLA, forward and backward
// (<fulgur/xla/random.h>; ModuleMatrix.DropoutModulesStayOnXla). Upsample holds
// no tensors either; in nearest mode by whole factors it compiles with XLA,
// forward and backward (the U-Net of tests/test_zoo.cpp).
//
// A module of your own that keeps tensors in members
// (`W = register_parameter("W", ...)`) cannot be detected in general: register
// a hook that rebinds them (below). Without one, its forward would mix devices,
// which on the lazy device aborts the process (a glog CHECK, not an
// exception). So a move TO a lazy device throws std::runtime_error naming the
// module and every old parameter/buffer still referenced after the move.
void move_module(torch::nn::Module& module, const c10::Device& device);

// Replaces `t` by its moved counterpart: the new tensor when `t` was one of the
// module's parameters/buffers (ties kept), else a copy of `t` on the target
// device (memoized, so two members sharing a tensor still share it); an
// undefined tensor is left alone.
using TensorRemap = std::function<void(at::Tensor&)>;

// Registers a hook called by move_module for every submodule (after the
// built-in rebinding), in registration order. A hook rebinds the members of
// the modules it knows and returns true; returning true stops the later hooks
// for that submodule. Example:
//   fulgur::register_module_mover([](torch::nn::Module& m, const fulgur::TensorRemap& remap) {
//     auto* net = dynamic_cast<MyNetImpl*>(&m);
//     if (!net) return false;
//     remap(net->W);
//     remap(net->mask);  // an unregistered member tensor moves too
//     return true;
//   });
void register_module_mover(std::function<bool(torch::nn::Module&, const TensorRemap&)> hook);

}  // namespace fulgur
