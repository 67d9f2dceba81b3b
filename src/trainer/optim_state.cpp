#include "trainer/optim_state.h"

#include <fulgur/lightning_module.h>

#include <torch/serialize.h>
#include <torch/torch.h>

#include <sstream>
#include <stdexcept>

namespace fulgur::detail {
namespace {

using fulgur::make_dict;

using torch::optim::Adam;
using torch::optim::AdamOptions;
using torch::optim::AdamParamState;
using torch::optim::AdamW;
using torch::optim::AdamWOptions;
using torch::optim::AdamWParamState;
using torch::optim::SGD;
using torch::optim::SGDOptions;
using torch::optim::SGDParamState;

c10::Dict<std::string, c10::IValue> group_options(torch::optim::Optimizer& opt, const torch::optim::OptimizerParamGroup& g) {
  auto d = make_dict();
  const auto& o = g.options();
  if (dynamic_cast<SGD*>(&opt)) {
    const auto& s = static_cast<const SGDOptions&>(o);
    d.insert("lr", s.lr());
    d.insert("momentum", s.momentum());
    d.insert("dampening", s.dampening());
    d.insert("weight_decay", s.weight_decay());
    d.insert("nesterov", s.nesterov());
  } else if (dynamic_cast<AdamW*>(&opt)) {
    const auto& s = static_cast<const AdamWOptions&>(o);
    d.insert("lr", s.lr());
    d.insert("betas", c10::ivalue::Tuple::create({std::get<0>(s.betas()), std::get<1>(s.betas())}));
    d.insert("eps", s.eps());
    d.insert("weight_decay", s.weight_decay());
    d.insert("amsgrad", s.amsgrad());
  } else if (dynamic_cast<Adam*>(&opt)) {
    const auto& s = static_cast<const AdamOptions&>(o);
    d.insert("lr", s.lr());
    d.insert("betas", c10::ivalue::Tuple::create({std::get<0>(s.betas()), std::get<1>(s.betas())}));
    d.insert("eps", s.eps());
    d.insert("weight_decay", s.weight_decay());
    d.insert("amsgrad", s.amsgrad());
  } else {
    d.insert("lr", o.get_lr());
  }
  return d;
}

template <typename State>
void set_adam_state(State& st, const c10::Dict<std::string, c10::IValue>& d) {
  st.step(static_cast<int64_t>(d.at("step").isTensor() ? d.at("step").toTensor().item<double>() : d.at("step").toDouble()));
  st.exp_avg(d.at("exp_avg").toTensor().clone());
  st.exp_avg_sq(d.at("exp_avg_sq").toTensor().clone());
  if (d.contains("max_exp_avg_sq")) st.max_exp_avg_sq(d.at("max_exp_avg_sq").toTensor().clone());
}

template <typename State>
c10::Dict<std::string, c10::IValue> adam_state(const State& st) {
  auto d = make_dict();
  d.insert("step", torch::tensor(static_cast<double>(st.step()), torch::kFloat32));
  d.insert("exp_avg", st.exp_avg().to(torch::kCPU));
  d.insert("exp_avg_sq", st.exp_avg_sq().to(torch::kCPU));
  if (st.max_exp_avg_sq().defined()) d.insert("max_exp_avg_sq", st.max_exp_avg_sq().to(torch::kCPU));
  return d;
}

bool known(torch::optim::Optimizer& opt) {
  return dynamic_cast<SGD*>(&opt) || dynamic_cast<Adam*>(&opt) || dynamic_cast<AdamW*>(&opt);
}

}  // namespace

std::string optimizer_state_key(const at::Tensor& p) { return c10::guts::to_string(p.unsafeGetTensorImpl()); }

c10::IValue optimizer_state_dict(torch::optim::Optimizer& opt) {
  auto out = make_dict();
  if (!known(opt)) {
    std::ostringstream os;
    torch::serialize::OutputArchive archive;
    opt.save(archive);
    archive.save_to(os);
    const std::string bytes = os.str();
    auto t = torch::empty({static_cast<int64_t>(bytes.size())}, torch::kUInt8);
    std::memcpy(t.data_ptr(), bytes.data(), bytes.size());
    out.insert("fulgur_archive", t);
    return out;
  }
  auto state = c10::impl::toTypedDict<int64_t, c10::IValue>(c10::impl::GenericDict(c10::IntType::get(), c10::AnyType::get()));
  c10::impl::GenericList groups(c10::AnyType::get());
  int64_t index = 0;
  for (auto& g : opt.param_groups()) {
    auto d = group_options(opt, g);
    c10::List<int64_t> ids;
    for (auto& p : g.params()) {
      auto it = opt.state().find(optimizer_state_key(p));
      if (it != opt.state().end()) {
        if (auto* s = dynamic_cast<SGDParamState*>(it->second.get())) {
          auto sd = make_dict();
          if (s->momentum_buffer().defined()) sd.insert("momentum_buffer", s->momentum_buffer().to(torch::kCPU));
          state.insert(index, sd);
        } else if (auto* a = dynamic_cast<AdamWParamState*>(it->second.get())) {
          state.insert(index, adam_state(*a));
        } else if (auto* b = dynamic_cast<AdamParamState*>(it->second.get())) {
          state.insert(index, adam_state(*b));
        }
      }
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
  if (!value.isGenericDict()) throw std::runtime_error(where + ": optimizer state is not a dict");
  auto d = c10::impl::toTypedDict<std::string, c10::IValue>(value.toGenericDict());
  if (d.contains("fulgur_archive")) {
    auto t = d.at("fulgur_archive").toTensor().contiguous();
    std::istringstream is(std::string(static_cast<const char*>(t.data_ptr()), t.numel()));
    torch::serialize::InputArchive archive;
    archive.load_from(is);
    opt.load(archive);
    return;
  }
  if (!known(opt)) throw std::runtime_error(where + ": saved state is for SGD/Adam/AdamW, this optimizer is another kind");
  auto groups = d.at("param_groups").toList();
  auto state = d.at("state").toGenericDict();
  if (groups.size() != opt.param_groups().size()) {
    throw std::runtime_error(where + ": checkpoint has " + std::to_string(groups.size()) +
                             " parameter groups, the optimizer has " + std::to_string(opt.param_groups().size()));
  }
  int64_t index = 0;
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    auto gd = c10::impl::toTypedDict<std::string, c10::IValue>(groups.get(gi).toGenericDict());
    auto& g = opt.param_groups()[gi];
    const auto ids = gd.at("params").toIntList();
    if (ids.size() != g.params().size()) {
      throw std::runtime_error(where + ": parameter group " + std::to_string(gi) + " has " + std::to_string(ids.size()) +
                               " parameters in the checkpoint, " + std::to_string(g.params().size()) + " in the optimizer");
    }
    g.options().set_lr(gd.at("lr").toDouble());
    for (size_t k = 0; k < ids.size(); ++k, ++index) {
      auto& p = g.params()[k];
      const c10::IValue id(ids.get(k));
      if (!state.contains(id)) continue;
      auto sd = c10::impl::toTypedDict<std::string, c10::IValue>(state.at(id).toGenericDict());
      auto check = [&](const char* name) {
        const auto t = sd.at(name).toTensor();
        if (t.sizes() != p.sizes()) {
          throw std::runtime_error(where + ": optimizer state '" + name + "' of parameter " + std::to_string(index) +
                                   " has shape " + c10::str(t.sizes()) + ", the parameter " + c10::str(p.sizes()));
        }
        return t.to(p.device()).clone();
      };
      if (dynamic_cast<SGD*>(&opt)) {
        auto st = std::make_unique<SGDParamState>();
        if (sd.contains("momentum_buffer")) st->momentum_buffer(check("momentum_buffer"));
        opt.state()[optimizer_state_key(p)] = std::move(st);
      } else if (dynamic_cast<AdamW*>(&opt)) {
        auto st = std::make_unique<AdamWParamState>();
        set_adam_state(*st, sd);
        st->exp_avg(check("exp_avg"));
        st->exp_avg_sq(check("exp_avg_sq"));
        opt.state()[optimizer_state_key(p)] = std::move(st);
      } else {
        auto st = std::make_unique<AdamParamState>();
        set_adam_state(*st, sd);
        st->exp_avg(check("exp_avg"));
        st->exp_avg_sq(check("exp_avg_sq"));
        opt.state()[optimizer_state_key(p)] = std::move(st);
      }
    }
  }
}

void optimizer_state_to_params_device(torch::optim::Optimizer& opt) {
  for (auto& g : opt.param_groups()) {
    for (auto& p : g.params()) {
      auto it = opt.state().find(optimizer_state_key(p));
      if (it == opt.state().end()) continue;
      auto dev = p.device();
      if (auto* s = dynamic_cast<SGDParamState*>(it->second.get())) {
        if (s->momentum_buffer().defined()) s->momentum_buffer(s->momentum_buffer().to(dev));
      } else if (auto* a = dynamic_cast<AdamWParamState*>(it->second.get())) {
        a->exp_avg(a->exp_avg().to(dev));
        a->exp_avg_sq(a->exp_avg_sq().to(dev));
        if (a->max_exp_avg_sq().defined()) a->max_exp_avg_sq(a->max_exp_avg_sq().to(dev));
      } else if (auto* b = dynamic_cast<AdamParamState*>(it->second.get())) {
        b->exp_avg(b->exp_avg().to(dev));
        b->exp_avg_sq(b->exp_avg_sq().to(dev));
        if (b->max_exp_avg_sq().defined()) b->max_exp_avg_sq(b->max_exp_avg_sq().to(dev));
      }
    }
  }
}

}  // namespace fulgur::detail
