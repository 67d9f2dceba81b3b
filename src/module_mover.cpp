// SPDX-License-Identifier: Apache-2.0
#include <fulgur/module_mover.h>

#include <torch/nn/module.h>
#include <torch/torch.h>

#include <torch/csrc/lazy/core/lazy_graph_executor.h>
#include <torch/csrc/lazy/core/tensor.h>

#include <cstdio>
#include <mutex>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>
#include <vector>

// torch::nn::Module::to(kLazy) throws in 1.13 ("incompatible tensor type" in
// set_data), and set_data from lazy into lazy is silently ignored, so the
// tensors are replaced instead: in the module's parameter and buffer dicts,
// and in the member handles that forward() reads.
//
// Module's parameters_ (protected) and buffers_ (private) are reached through
// `template <typename Derived> friend class Cloneable;` in Module: every
// specialization of Cloneable is a friend, including this explicit one with a
// private tag type.

namespace fulgur::module_mover_detail {
struct AccessTag {};
}  // namespace fulgur::module_mover_detail

template <>
class torch::nn::Cloneable<fulgur::module_mover_detail::AccessTag> {
 public:
  using Dict = torch::OrderedDict<std::string, torch::Tensor>;
  static Dict& params(torch::nn::Module& m) { return m.parameters_; }
  static Dict& buffers(torch::nn::Module& m) { return m.buffers_; }
};

namespace fulgur {
namespace module_mover_detail {
namespace {

using ModuleAccess = torch::nn::Cloneable<AccessTag>;

bool is_lazy(const at::Tensor& t) { return t.defined() && t.device().type() == c10::kLazy; }

// Tensor members of the built-in modules, detected per class (a member exists
// and is a Tensor).
#define FULGUR_TENSOR_MEMBER(NAME)                                                                               \
  template <class T, class = void>                                                                               \
  struct has_##NAME : std::false_type {};                                                                        \
  template <class T>                                                                                             \
  struct has_##NAME<T, std::void_t<decltype(std::declval<T&>().NAME)>>                                           \
      : std::is_same<std::decay_t<decltype(std::declval<T&>().NAME)>, torch::Tensor> {};                       \
  template <class T>                                                                                             \
  void remap_##NAME(T& m, const TensorRemap& remap) {                                                            \
    if constexpr (has_##NAME<T>::value) remap(m.NAME);                                                           \
  }
FULGUR_TENSOR_MEMBER(weight)
FULGUR_TENSOR_MEMBER(bias)
FULGUR_TENSOR_MEMBER(running_mean)
FULGUR_TENSOR_MEMBER(running_var)
FULGUR_TENSOR_MEMBER(num_batches_tracked)
FULGUR_TENSOR_MEMBER(in_proj_weight)
FULGUR_TENSOR_MEMBER(in_proj_bias)
FULGUR_TENSOR_MEMBER(bias_k)
FULGUR_TENSOR_MEMBER(bias_v)
FULGUR_TENSOR_MEMBER(q_proj_weight)
FULGUR_TENSOR_MEMBER(k_proj_weight)
FULGUR_TENSOR_MEMBER(v_proj_weight)
FULGUR_TENSOR_MEMBER(weight_ih)
FULGUR_TENSOR_MEMBER(weight_hh)
FULGUR_TENSOR_MEMBER(bias_ih)
FULGUR_TENSOR_MEMBER(bias_hh)
FULGUR_TENSOR_MEMBER(pos_weight)
FULGUR_TENSOR_MEMBER(_random_samples)
#undef FULGUR_TENSOR_MEMBER

template <class Impl>
bool rebind(torch::nn::Module& module, const TensorRemap& remap) {
  auto* m = dynamic_cast<Impl*>(&module);
  if (!m) return false;
  remap_weight(*m, remap);
  remap_bias(*m, remap);
  remap_running_mean(*m, remap);
  remap_running_var(*m, remap);
  remap_num_batches_tracked(*m, remap);
  remap_in_proj_weight(*m, remap);
  remap_in_proj_bias(*m, remap);
  remap_bias_k(*m, remap);
  remap_bias_v(*m, remap);
  remap_q_proj_weight(*m, remap);
  remap_k_proj_weight(*m, remap);
  remap_v_proj_weight(*m, remap);
  remap_weight_ih(*m, remap);
  remap_weight_hh(*m, remap);
  remap_bias_ih(*m, remap);
  remap_bias_hh(*m, remap);
  remap_pos_weight(*m, remap);
  remap__random_samples(*m, remap);
  return true;
}

// RNN/LSTM/GRU read the protected flat_weights_, rebuilt from the parameter
// dict by the protected reset_flat_weights(); a pointer to it formed through a
// derived class is allowed.
template <class Impl>
struct FlatWeightsAccess : Impl {
  static void reset(Impl& m) { (m.*(&FlatWeightsAccess::reset_flat_weights))(); }
};

template <class Impl>
bool rebind_rnn(torch::nn::Module& module) {
  auto* m = dynamic_cast<Impl*>(&module);
  if (!m) return false;
  FlatWeightsAccess<Impl>::reset(*m);
  return true;
}

// The losses with class weights keep the tensor in their options too (options.weight(),
// options.pos_weight()), which forward reads: they take the moved buffers.
bool rebind_loss_options(torch::nn::Module& module) {
  using namespace torch::nn;
  if (auto* m = dynamic_cast<NLLLossImpl*>(&module)) {
    m->options.weight(m->weight);
  } else if (auto* c = dynamic_cast<CrossEntropyLossImpl*>(&module)) {
    c->options.weight(c->weight);
  } else if (auto* b = dynamic_cast<BCEWithLogitsLossImpl*>(&module)) {
    b->options.weight(b->weight);
    b->options.pos_weight(b->pos_weight);
  } else {
    return false;
  }
  return true;
}

template <class... Impls>
bool rebind_any(torch::nn::Module& m, const TensorRemap& remap) {
  return (rebind<Impls>(m, remap) || ...);
}

bool rebind_builtin(torch::nn::Module& m, const TensorRemap& remap) {
  using namespace torch::nn;
  const bool found = rebind_any<LinearImpl, Conv1dImpl, Conv2dImpl, Conv3dImpl, BatchNorm1dImpl, BatchNorm2dImpl,
                    BatchNorm3dImpl, LayerNormImpl, EmbeddingImpl, GroupNormImpl, BilinearImpl, ConvTranspose1dImpl,
                    ConvTranspose2dImpl, ConvTranspose3dImpl, InstanceNorm1dImpl, InstanceNorm2dImpl,
                    InstanceNorm3dImpl, EmbeddingBagImpl, PReLUImpl, MultiheadAttentionImpl, RNNCellImpl,
                    LSTMCellImpl, GRUCellImpl, NLLLossImpl, CrossEntropyLossImpl, BCEWithLogitsLossImpl,
                    FractionalMaxPool2dImpl, FractionalMaxPool3dImpl>(m, remap) ||
                     rebind_rnn<RNNImpl>(m) || rebind_rnn<LSTMImpl>(m) || rebind_rnn<GRUImpl>(m);
  if (found) rebind_loss_options(m);
  return found;
}

using Hook = std::function<bool(torch::nn::Module&, const TensorRemap&)>;

std::mutex& hooks_mutex() {
  static std::mutex mu;
  return mu;
}
std::vector<Hook>& hooks() {
  static std::vector<Hook> h;
  return h;
}

// Runs the pending lazy work of `ts` as one graph, so that copying them off
// the lazy device is a plain copy instead of one graph execution each.
void sync_lazy(const std::vector<at::Tensor>& ts) {
  std::vector<torch::lazy::LazyTensorPtr> lts;
  for (const auto& t : ts) {
    if (!is_lazy(t)) continue;
    if (auto lt = torch::lazy::TryGetLtcTensor(t)) lts.push_back(lt);
  }
  if (lts.empty()) return;
  torch::lazy::LazyGraphExecutor::Get()->SyncTensorsGraph(&lts, /*devices=*/{}, /*wait=*/true,
                                                         /*sync_ltc_data=*/true);
}

struct Moved {
  at::Tensor old;     // keeps the old TensorImpl alive while remapping
  std::string name;   // a name for messages ("" for member-only tensors)
  std::string owner;  // the module that registered it, as "path (Type)"
  size_t extra_refs;  // references to `old` that the copy itself holds
};

// Moves tensors to one device, each distinct tensor once: a tensor met again (tied weights, a
// member handle of a registered parameter) becomes the same new tensor.
class TensorMover {
 public:
  explicit TensorMover(const c10::Device& device) : device_(device) {}

  // Replaces `t` by its copy on the device (with its grad, and requires_grad for a parameter).
  // `name` and `owner` name it in move_module's error ("" for a member-only tensor).
  void move(at::Tensor& t, bool is_param, const std::string& name, const std::string& owner) {
    if (!t.defined()) return;
    auto it = map_.find(t.unsafeGetTensorImpl());
    if (it != map_.end()) {
      t = it->second;
      return;
    }
    if (t.device() == device_) return;
    const size_t before = t.use_count();
    // Copies off the lazy device can come back with any strides; keep them
    // dense (autograd's gradient layout contract wants grads like params).
    const bool from_lazy = is_lazy(t);
    at::Tensor nt = t.to(device_).detach();
    if (from_lazy) nt = nt.contiguous();
    const size_t after = t.use_count();
    const size_t extra = after > before ? after - before : 0;  // e.g. lazy device data aliasing the CPU tensor
    if (is_param) nt.set_requires_grad(t.requires_grad());
    if (t.grad().defined()) {
      at::Tensor g = t.grad().to(device_).detach();
      nt.mutable_grad() = is_lazy(t.grad()) ? g.contiguous() : g;
    }
    map_.emplace(t.unsafeGetTensorImpl(), nt);
    moved_.push_back({t, name, owner, extra});
    t = nt;
  }

  const std::vector<Moved>& moved() const { return moved_; }

 private:
  c10::Device device_;
  std::unordered_map<const c10::TensorImpl*, at::Tensor> map_;  // old -> new, keeps ties
  std::vector<Moved> moved_;
};

// 1. The dicts. named_* give prefixed names for the error of check_none_left_behind.
void move_registered(torch::nn::Module& module, TensorMover& mover) {
  using torch::nn::Module;
  std::unordered_map<const Module*, std::string> prefix;
  prefix[&module] = "";
  for (const auto& item : module.named_modules("", /*include_self=*/false)) {
    prefix.emplace(item.value().get(), item.key() + ".");
  }
  module.apply([&](Module& m) {
    const std::string& pre = prefix.count(&m) ? prefix[&m] : std::string();
    const std::string owner = pre.empty() ? m.name() : pre.substr(0, pre.size() - 1) + " (" + m.name() + ")";
    for (auto& item : ModuleAccess::params(m)) mover.move(item.value(), true, pre + item.key(), owner);
    for (auto& item : ModuleAccess::buffers(m)) mover.move(item.value(), false, pre + item.key(), owner);
  });
}

// 2. The member handles: built-in modules, then the registered hooks.
void rebind_members(torch::nn::Module& module, TensorMover& mover) {
  const TensorRemap remap = [&](at::Tensor& t) { mover.move(t, false, "", ""); };
  std::vector<Hook> user_hooks;
  {
    std::lock_guard<std::mutex> lock(hooks_mutex());
    user_hooks = hooks();
  }
  module.apply([&](torch::nn::Module& m) {
    rebind_builtin(m, remap);
    for (const auto& h : user_hooks) {
      if (h(m, remap)) break;
    }
  });
}

// 3. A parameter/buffer still referenced elsewhere is most likely a member
// handle of a module the mover does not know; its forward would mix
// devices, which aborts the process on the lazy device. Moving TO the lazy
// device that is an error naming the module; moving back, the optimizer
// legitimately still holds the lazy tensors.
void check_none_left_behind(const std::vector<Moved>& moved, const c10::Device& device) {
  if (device.type() != c10::kLazy) return;
  std::vector<const Moved*> stale;
  for (const auto& mv : moved) {
    if (!mv.name.empty() && mv.old.use_count() > 1 + mv.extra_refs) stale.push_back(&mv);
  }
  if (stale.empty()) return;
  std::string names;
  for (size_t i = 0; i < stale.size() && i < 5; ++i) names += (i ? ", " : "") + stale[i]->name;
  if (stale.size() > 5) names += ", ... (" + std::to_string(stale.size()) + " in all)";
  throw std::runtime_error(
      "cannot move module " + stale[0]->owner + " to " + device.str() + ": " + names +
      (stale.size() == 1 ? " is" : " are") +
      " still referenced after the move, most likely by a member the mover does not know. Register a hook "
      "with fulgur::register_module_mover that rebinds the module's tensor members (see "
      "<fulgur/module_mover.h>); build optimizers after the move, and do not keep outputs of an earlier "
      "forward (their autograd graph holds the old tensors)");
}

}  // namespace
}  // namespace module_mover_detail

void register_module_mover(std::function<bool(torch::nn::Module&, const TensorRemap&)> hook) {
  if (!hook) return;
  std::lock_guard<std::mutex> lock(module_mover_detail::hooks_mutex());
  module_mover_detail::hooks().push_back(std::move(hook));
}

void move_module(torch::nn::Module& module, const c10::Device& device) {
  using namespace module_mover_detail;

  // Every parameter, buffer and grad, named, once per submodule occurrence.
  bool any_lazy = device.type() == c10::kLazy;
  std::vector<at::Tensor> all;
  for (const auto& p : module.named_parameters(true)) {
    all.push_back(p.value());
    if (p.value().grad().defined()) all.push_back(p.value().grad());
  }
  for (const auto& b : module.named_buffers(true)) all.push_back(b.value());
  for (const auto& t : all) any_lazy = any_lazy || is_lazy(t);
  if (!any_lazy) {
    module.to(device);
    return;
  }

  torch::NoGradGuard no_grad;
  sync_lazy(all);
  all.clear();  // no extra references while counting them below

  TensorMover mover(device);
  move_registered(module, mover);
  rebind_members(module, mover);
  check_none_left_behind(mover.moved(), device);
}

}  // namespace fulgur
