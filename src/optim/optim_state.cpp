// SPDX-License-Identifier: Apache-2.0
#include "optim/optim_state.h"

#include "optim/fused_adam.h"

#include "serialize/torch_archive.h"

#include <fulgur/lightning_module.h>
#include <fulgur/serialization_error.h>

#include <torch/torch.h>

#include <cmath>
#include <functional>
#include <stdexcept>
#include <typeinfo>

namespace fulgur::detail {
namespace {

using fulgur::make_dict;
using Dict = c10::Dict<std::string, c10::IValue>;
using torch::optim::OptimizerParamState;
using TensorMap = std::function<at::Tensor(const at::Tensor&)>;

}  // namespace

// What a checkpoint holds for one parameter's state, as Python names it.
struct StateReader {
  const Dict& d;
  const at::Tensor& param;
  const std::string& where;  // "checkpoint X, optimizer 0, parameter 3"

  c10::IValue at(const char* key) const {
    if (!d.contains(key)) {
      std::string have;
      for (const auto& kv : d) have += (have.empty() ? "" : ", ") + kv.key();
      throw SerializationError(where + ": the state has no '" + key + "' (it has: " + (have.empty() ? "nothing" : have) +
                               "); was it saved by another kind of optimizer?");
    }
    return d.at(key);
  }
  bool has(const char* key) const { return d.contains(key) && !d.at(key).isNone(); }
  at::Tensor tensor(const char* key) const {
    const c10::IValue v = at(key);
    if (!v.isTensor()) throw SerializationError(where + ": '" + key + "' holds a " + v.tagKind() + ", not a tensor");
    const at::Tensor t = v.toTensor();
    if (t.sizes() != param.sizes()) {
      throw SerializationError(where + ": '" + key + "' has shape " + c10::str(t.sizes()) + ", the parameter " +
                               c10::str(param.sizes()));
    }
    return t.to(param.device(), param.scalar_type()).clone();
  }
  // A step count: Python stores a 0-d tensor, older files a number.
  int64_t step() const {
    const c10::IValue v = at("step");
    double s = 0;
    if (v.isTensor() && v.toTensor().numel() == 1) {
      s = v.toTensor().item<double>();
    } else if (v.isDouble() || v.isInt()) {
      s = v.toScalar().toDouble();
    } else {
      throw SerializationError(where + ": 'step' holds a " + v.tagKind() + ", not a number");
    }
    if (!std::isfinite(s) || s < 0 || s > 9007199254740992.0 || s != std::floor(s)) {
      throw SerializationError(where + ": 'step' is " + std::to_string(s) + ", not a whole number in [0, 2^53]");
    }
    return static_cast<int64_t>(s);
  }
};

namespace {

at::Tensor cpu(const at::Tensor& t) { return t.to(torch::kCPU); }
c10::IValue step_tensor(int64_t step) { return torch::tensor(static_cast<double>(step), torch::kFloat32); }

template <typename Opt>
bool is(const torch::optim::Optimizer& o) {
  return dynamic_cast<const Opt*>(&o) != nullptr;
}

at::Tensor mapped(const at::Tensor& t, const TensorMap& f) { return t.defined() ? f(t) : t; }

template <typename State>
void map_adam(OptimizerParamState& base, const TensorMap& f) {
  auto* s = dynamic_cast<State*>(&base);
  if (!s) return;
  s->exp_avg(mapped(s->exp_avg(), f));
  s->exp_avg_sq(mapped(s->exp_avg_sq(), f));
  s->max_exp_avg_sq(mapped(s->max_exp_avg_sq(), f));
}

template <typename State>
Dict save_adam(OptimizerParamState& base) {
  auto& st = static_cast<State&>(base);
  Dict d = make_dict();
  d.insert("step", step_tensor(st.step()));
  d.insert("exp_avg", cpu(st.exp_avg()));
  d.insert("exp_avg_sq", cpu(st.exp_avg_sq()));
  if (st.max_exp_avg_sq().defined()) d.insert("max_exp_avg_sq", cpu(st.max_exp_avg_sq()));
  return d;
}

template <typename State>
std::unique_ptr<OptimizerParamState> load_adam(const StateReader& r) {
  auto st = std::make_unique<State>();
  st->step(r.step());
  st->exp_avg(r.tensor("exp_avg"));
  st->exp_avg_sq(r.tensor("exp_avg_sq"));
  if (r.has("max_exp_avg_sq")) st->max_exp_avg_sq(r.tensor("max_exp_avg_sq"));
  return st;
}

template <typename Options>
void adam_options(const torch::optim::OptimizerOptions& o, Dict& d) {
  const auto& s = static_cast<const Options&>(o);
  d.insert("lr", s.lr());
  d.insert("betas", c10::ivalue::Tuple::create({std::get<0>(s.betas()), std::get<1>(s.betas())}));
  d.insert("eps", s.eps());
  d.insert("weight_decay", s.weight_decay());
  d.insert("amsgrad", s.amsgrad());
}

// The order matters only for types derived from another in the table (none
// in libtorch 1.13): the first match serves.
const std::vector<OptimizerAdapter>& adapters() {
  using namespace torch::optim;
  static const std::vector<OptimizerAdapter> table = {
      {"SGD", typeid(SGD), is<SGD>,
       [](const OptimizerOptions& o, Dict& d) {
         const auto& s = static_cast<const SGDOptions&>(o);
         d.insert("lr", s.lr());
         d.insert("momentum", s.momentum());
         d.insert("dampening", s.dampening());
         d.insert("weight_decay", s.weight_decay());
         d.insert("nesterov", s.nesterov());
       },
       [](OptimizerParamState& base) {
         auto& st = static_cast<SGDParamState&>(base);
         Dict d = make_dict();
         if (st.momentum_buffer().defined()) d.insert("momentum_buffer", cpu(st.momentum_buffer()));
         return d;
       },
       [](const StateReader& r) -> std::unique_ptr<OptimizerParamState> {
         auto st = std::make_unique<SGDParamState>();
         if (r.has("momentum_buffer")) st->momentum_buffer(r.tensor("momentum_buffer"));
         return st;
       },
       [](OptimizerParamState& base, const TensorMap& f) {
         if (auto* st = dynamic_cast<SGDParamState*>(&base)) st->momentum_buffer(mapped(st->momentum_buffer(), f));
       },
       nullptr},
      {"AdamW", typeid(AdamW), is<AdamW>, adam_options<AdamWOptions>, save_adam<AdamWParamState>,
       load_adam<AdamWParamState>, map_adam<AdamWParamState>, fused_adamw_step},
      {"Adam", typeid(Adam), is<Adam>, adam_options<AdamOptions>, save_adam<AdamParamState>, load_adam<AdamParamState>,
       map_adam<AdamParamState>, fused_adam_step},
      {"RMSprop", typeid(RMSprop), is<RMSprop>,
       [](const OptimizerOptions& o, Dict& d) {
         const auto& s = static_cast<const RMSpropOptions&>(o);
         d.insert("lr", s.lr());
         d.insert("alpha", s.alpha());
         d.insert("eps", s.eps());
         d.insert("weight_decay", s.weight_decay());
         d.insert("momentum", s.momentum());
         d.insert("centered", s.centered());
       },
       [](OptimizerParamState& base) {
         auto& st = static_cast<RMSpropParamState&>(base);
         Dict d = make_dict();
         d.insert("step", step_tensor(st.step()));
         d.insert("square_avg", cpu(st.square_avg()));
         if (st.momentum_buffer().defined()) d.insert("momentum_buffer", cpu(st.momentum_buffer()));
         if (st.grad_avg().defined()) d.insert("grad_avg", cpu(st.grad_avg()));
         return d;
       },
       [](const StateReader& r) -> std::unique_ptr<OptimizerParamState> {
         auto st = std::make_unique<RMSpropParamState>();
         st->step(r.step());
         st->square_avg(r.tensor("square_avg"));
         if (r.has("momentum_buffer")) st->momentum_buffer(r.tensor("momentum_buffer"));
         if (r.has("grad_avg")) st->grad_avg(r.tensor("grad_avg"));
         return st;
       },
       [](OptimizerParamState& base, const TensorMap& f) {
         auto* st = dynamic_cast<RMSpropParamState*>(&base);
         if (!st) return;
         st->square_avg(mapped(st->square_avg(), f));
         st->momentum_buffer(mapped(st->momentum_buffer(), f));
         st->grad_avg(mapped(st->grad_avg(), f));
       },
       nullptr},
      {"Adagrad", typeid(Adagrad), is<Adagrad>,
       [](const OptimizerOptions& o, Dict& d) {
         const auto& s = static_cast<const AdagradOptions&>(o);
         d.insert("lr", s.lr());
         d.insert("lr_decay", s.lr_decay());
         d.insert("weight_decay", s.weight_decay());
         d.insert("initial_accumulator_value", s.initial_accumulator_value());
         d.insert("eps", s.eps());
       },
       [](OptimizerParamState& base) {
         auto& st = static_cast<AdagradParamState&>(base);
         Dict d = make_dict();
         d.insert("step", step_tensor(st.step()));
         d.insert("sum", cpu(st.sum()));
         return d;
       },
       [](const StateReader& r) -> std::unique_ptr<OptimizerParamState> {
         auto st = std::make_unique<AdagradParamState>();
         st->step(r.step());
         st->sum(r.tensor("sum"));
         return st;
       },
       [](OptimizerParamState& base, const TensorMap& f) {
         if (auto* st = dynamic_cast<AdagradParamState*>(&base)) st->sum(mapped(st->sum(), f));
       },
       nullptr},
  };
  return table;
}

std::string supported() {
  std::string s;
  for (const OptimizerAdapter& a : adapters()) s += (s.empty() ? "" : ", ") + std::string(a.name);
  return s;
}

c10::IValue get(const Dict& d, const char* key, const std::string& where) {
  if (!d.contains(key)) throw SerializationError(where + ": no '" + key + "' key");
  return d.at(key);
}

}  // namespace

const OptimizerAdapter* optimizer_adapter(const torch::optim::Optimizer& optimizer) {
  for (const OptimizerAdapter& a : adapters()) {
    if (a.matches(optimizer)) return &a;
  }
  return nullptr;
}

void* optimizer_state_key(const at::Tensor& p) { return p.unsafeGetTensorImpl(); }

c10::IValue optimizer_state_dict(torch::optim::Optimizer& opt) {
  const OptimizerAdapter* a = optimizer_adapter(opt);
  if (!a) {
    throw std::invalid_argument(std::string("cannot checkpoint an optimizer of type ") + typeid(opt).name() +
                                ": fulgur saves the state of " + supported() +
                                " (as plain tensors and numbers, the layout of Python's state_dict)");
  }
  Dict out = make_dict();
  c10::impl::GenericDict state(c10::IntType::get(), c10::AnyType::get());
  c10::impl::GenericList groups(c10::AnyType::get());
  int64_t index = 0;
  for (auto& g : opt.param_groups()) {
    Dict d = make_dict();
    a->options(g.options(), d);
    c10::List<int64_t> ids;
    for (auto& p : g.params()) {
      const auto it = opt.state().find(optimizer_state_key(p));
      if (it != opt.state().end()) state.insert(index, a->save(*it->second));
      ids.push_back(index++);
    }
    d.insert("params", ids);
    groups.push_back(d);
  }
  out.insert("state", state);
  out.insert("param_groups", groups);
  return out;
}

void load_optimizer_state_dict(torch::optim::Optimizer& opt, const c10::IValue& value, const std::string& where) {
  const Dict d = as_str_dict(value, where + ": the optimizer state");
  if (d.contains("fulgur_archive")) {
    throw SerializationError(where + ": the optimizer state is a serialized libtorch archive, which older fulgur "
                             "versions wrote; it is not loaded, because loading one compiles and runs TorchScript");
  }
  const OptimizerAdapter* a = optimizer_adapter(opt);
  if (!a) {
    throw std::invalid_argument(where + ": cannot restore an optimizer of type " + typeid(opt).name() +
                                "; fulgur restores " + supported());
  }
  const c10::IValue groups_v = get(d, "param_groups", where);
  const c10::IValue state_v = get(d, "state", where);
  if (!groups_v.isList()) throw SerializationError(where + ": 'param_groups' is a " + groups_v.tagKind() + ", not a list");
  if (!state_v.isGenericDict() || (state_v.toGenericDict().size() > 0 &&
                                   state_v.toGenericDict().keyType()->kind() != c10::TypeKind::IntType)) {
    throw SerializationError(where + ": 'state' is a " + state_v.type()->repr_str() + ", not a dict with int keys");
  }
  const auto groups = groups_v.toList();
  const auto state = state_v.toGenericDict();
  if (groups.size() != opt.param_groups().size()) {
    throw SerializationError(where + ": the checkpoint has " + std::to_string(groups.size()) +
                             " parameter groups, the optimizer has " + std::to_string(opt.param_groups().size()));
  }
  // Read everything first, so that a bad entry leaves the optimizer untouched.
  std::vector<std::pair<void*, std::unique_ptr<OptimizerParamState>>> loaded;
  std::vector<double> lrs;
  int64_t index = 0;
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const std::string gwhere = where + ", parameter group " + std::to_string(gi);
    const Dict gd = as_str_dict(groups.get(gi), gwhere);
    auto& g = opt.param_groups()[gi];
    const c10::IValue ids_v = get(gd, "params", gwhere);
    const c10::IValue lr = get(gd, "lr", gwhere);
    if (!ids_v.isList()) throw SerializationError(gwhere + ": 'params' is a " + ids_v.tagKind() + ", not a list");
    if (!lr.isDouble() && !lr.isInt()) throw SerializationError(gwhere + ": 'lr' is a " + lr.tagKind() + ", not a number");
    lrs.push_back(lr.toScalar().toDouble());
    const auto ids = ids_v.toList();
    if (ids.size() != g.params().size()) {
      throw SerializationError(gwhere + " has " + std::to_string(ids.size()) + " parameters in the checkpoint, " +
                               std::to_string(g.params().size()) + " in the optimizer");
    }
    for (size_t k = 0; k < ids.size(); ++k, ++index) {
      const c10::IValue id = ids.get(k);
      if (!id.isInt()) throw SerializationError(gwhere + ": parameter id " + std::to_string(k) + " is not an int");
      if (!state.contains(id)) continue;
      const std::string pwhere = where + ", parameter " + std::to_string(index);
      const Dict sd = as_str_dict(state.at(id), pwhere + ": the state");
      const at::Tensor& p = g.params()[k];
      loaded.emplace_back(optimizer_state_key(p), a->load(StateReader{sd, p, pwhere}));
    }
  }
  for (size_t gi = 0; gi < groups.size(); ++gi) opt.param_groups()[gi].options().set_lr(lrs[gi]);
  for (auto& [key, st] : loaded) opt.state()[key] = std::move(st);
}

void map_state_tensors(OptimizerParamState& state, const TensorMap& f) {
  for (const OptimizerAdapter& a : adapters()) a.map_state(state, f);
}

void optimizer_state_to_params_device(torch::optim::Optimizer& opt) {
  for (auto& g : opt.param_groups()) {
    for (auto& p : g.params()) {
      auto it = opt.state().find(optimizer_state_key(p));
      if (it == opt.state().end()) continue;
      const c10::Device dev = p.device();
      map_state_tensors(*it->second, [&](const at::Tensor& t) { return t.to(dev); });
    }
  }
}

}  // namespace fulgur::detail
