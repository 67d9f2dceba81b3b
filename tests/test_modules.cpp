// SPDX-License-Identifier: Apache-2.0
// The module matrix (issue 40): every built-in module that move_module rebinds
// (include/fulgur/module_mover.h's list), a small instance moved to the xla device by the path
// the strategies use, runs forward and backward and matches eager. Each entry runs in a child
// process, so that a module the lazy core cannot run would fail its own entry (with the signal
// named) instead of aborting the test program.
#include "support.h"

#include <fulgur/module_mover.h>
#include <fulgur/xla/backend.h>

#include <ATen/CPUGeneratorImpl.h>

#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

using namespace fulgur;
namespace nn = torch::nn;

namespace {

// A module and a scalar loss of its forward on inputs made on `device`.
struct Entry {
  std::string name;
  std::function<std::shared_ptr<nn::Module>()> make;
  std::function<at::Tensor(nn::Module&, const c10::Device&)> loss;
  double tol = 1e-4;
};

template <class Holder, class... Args>
Entry simple(std::string name, std::vector<int64_t> input, Args... args) {
  return {std::move(name), [=] { return Holder(args...).ptr(); },
          [input](nn::Module& m, const c10::Device& d) {
            torch::manual_seed(3);
            auto x = torch::randn(input).to(d);
            auto out = dynamic_cast<typename Holder::Impl&>(m).forward(x);
            return (out * out).mean();
          }};
}

std::vector<Entry> matrix() {
  std::vector<Entry> e;
  e.push_back(simple<nn::Linear>("Linear", {3, 4}, 4, 5));
  e.push_back(simple<nn::Conv1d>("Conv1d", {2, 3, 8}, nn::Conv1dOptions(3, 4, 3).padding(1)));
  e.push_back(simple<nn::Conv2d>("Conv2d", {2, 3, 6, 6}, nn::Conv2dOptions(3, 4, 3).stride(2)));
  e.push_back(simple<nn::Conv3d>("Conv3d", {1, 2, 4, 4, 4}, nn::Conv3dOptions(2, 3, 3)));
  e.push_back(simple<nn::ConvTranspose1d>("ConvTranspose1d", {2, 3, 5}, nn::ConvTranspose1dOptions(3, 2, 3).stride(2)));
  e.push_back(simple<nn::ConvTranspose2d>("ConvTranspose2d", {1, 3, 4, 4}, nn::ConvTranspose2dOptions(3, 2, 3)));
  e.push_back(simple<nn::ConvTranspose3d>("ConvTranspose3d", {1, 2, 3, 3, 3}, nn::ConvTranspose3dOptions(2, 2, 2)));
  e.push_back(simple<nn::BatchNorm1d>("BatchNorm1d", {4, 3}, 3));
  e.push_back(simple<nn::BatchNorm2d>("BatchNorm2d", {2, 3, 4, 4}, 3));
  e.push_back(simple<nn::BatchNorm3d>("BatchNorm3d", {2, 3, 2, 2, 2}, 3));
  e.push_back(simple<nn::InstanceNorm1d>("InstanceNorm1d", {2, 3, 6}, nn::InstanceNorm1dOptions(3).affine(true)));
  e.push_back(simple<nn::InstanceNorm2d>("InstanceNorm2d", {2, 3, 4, 4}, nn::InstanceNorm2dOptions(3).affine(true)));
  e.push_back(simple<nn::InstanceNorm3d>("InstanceNorm3d", {1, 2, 3, 3, 3}, nn::InstanceNorm3dOptions(2).affine(true)));
  e.push_back(simple<nn::LayerNorm>("LayerNorm", {3, 5}, nn::LayerNormOptions({5})));
  e.push_back(simple<nn::GroupNorm>("GroupNorm", {2, 4, 3}, 2, 4));
  e.push_back(simple<nn::PReLU>("PReLU", {3, 4}, nn::PReLUOptions()));
  e.push_back(simple<nn::FractionalMaxPool2d>("FractionalMaxPool2d", {1, 2, 8, 8},
                                              nn::FractionalMaxPool2dOptions(2).output_size(std::vector<int64_t>{4, 4})));
  e.push_back(simple<nn::FractionalMaxPool3d>("FractionalMaxPool3d", {1, 2, 6, 6, 6},
                                              nn::FractionalMaxPool3dOptions(2).output_size(std::vector<int64_t>{3, 3, 3})));
  e.push_back({"Embedding", [] { return nn::Embedding(10, 4).ptr(); },
               [](nn::Module& m, const c10::Device& d) {
                 auto out = dynamic_cast<nn::EmbeddingImpl&>(m).forward(torch::tensor({1, 3, 3, 9}).to(d));
                 return (out * out).mean();
               }});
  e.push_back({"EmbeddingBag", [] { return nn::EmbeddingBag(nn::EmbeddingBagOptions(10, 4).mode(torch::kSum)).ptr(); },
               [](nn::Module& m, const c10::Device& d) {
                 auto out = dynamic_cast<nn::EmbeddingBagImpl&>(m).forward(torch::tensor({{1, 3}, {3, 9}}).to(d));
                 return (out * out).mean();
               }});
  e.push_back({"Bilinear", [] { return nn::Bilinear(3, 4, 2).ptr(); },
               [](nn::Module& m, const c10::Device& d) {
                 torch::manual_seed(3);
                 auto a = torch::randn({5, 3}).to(d), b = torch::randn({5, 4}).to(d);
                 auto out = dynamic_cast<nn::BilinearImpl&>(m).forward(a, b);
                 return (out * out).mean();
               }});
  e.push_back({"MultiheadAttention", [] { return nn::MultiheadAttention(8, 2).ptr(); },
               [](nn::Module& m, const c10::Device& d) {
                 torch::manual_seed(3);
                 auto q = torch::randn({4, 2, 8}).to(d);
                 auto out = std::get<0>(dynamic_cast<nn::MultiheadAttentionImpl&>(m).forward(q, q, q));
                 return (out * out).mean();
               }});
  auto cell = [](std::string name, auto make) -> Entry {
    return {name, make, [](nn::Module& m, const c10::Device& d) {
              torch::manual_seed(3);
              auto x = torch::randn({3, 4}).to(d);
              at::Tensor h;
              if (auto* r = dynamic_cast<nn::RNNCellImpl*>(&m)) h = r->forward(x);
              if (auto* g = dynamic_cast<nn::GRUCellImpl*>(&m)) h = g->forward(x);
              if (auto* l = dynamic_cast<nn::LSTMCellImpl*>(&m)) h = std::get<0>(l->forward(x));
              return (h * h).mean();
            }};
  };
  e.push_back(cell("RNNCell", [] { return nn::RNNCell(4, 5).ptr(); }));
  e.push_back(cell("GRUCell", [] { return nn::GRUCell(4, 5).ptr(); }));
  e.push_back(cell("LSTMCell", [] { return nn::LSTMCell(4, 5).ptr(); }));
  // The recurrent modules: each of 1 and 2 layers, batch_first both ways, bidirectional, with
  // and without an initial state, in two configurations per kind (every configuration takes
  // seconds of XLA compiles).
  struct Rnn {
    std::string kind;
    int layers;
    bool batch_first, bidirectional, initial;
  };
  for (const Rnn& c : std::vector<Rnn>{{"RNN", 1, false, false, false}, {"RNN", 2, true, true, true},
                                       {"GRU", 1, false, true, false}, {"GRU", 2, true, false, true},
                                       {"LSTM", 1, true, false, true}, {"LSTM", 2, false, true, false}}) {
    const std::string name = c.kind + " layers=" + std::to_string(c.layers) + (c.batch_first ? " batch_first" : "") +
                             (c.bidirectional ? " bidirectional" : "") + (c.initial ? " h0" : "");
    const int64_t dirs = c.bidirectional ? 2 : 1;
    e.push_back({name,
                 [c]() -> std::shared_ptr<nn::Module> {
                   if (c.kind == "RNN")
                     return nn::RNN(nn::RNNOptions(4, 5).num_layers(c.layers).batch_first(c.batch_first)
                                        .bidirectional(c.bidirectional)).ptr();
                   if (c.kind == "GRU")
                     return nn::GRU(nn::GRUOptions(4, 5).num_layers(c.layers).batch_first(c.batch_first)
                                        .bidirectional(c.bidirectional)).ptr();
                   return nn::LSTM(nn::LSTMOptions(4, 5).num_layers(c.layers).batch_first(c.batch_first)
                                       .bidirectional(c.bidirectional)).ptr();
                 },
                 [c, dirs](nn::Module& m, const c10::Device& d) {
                   torch::manual_seed(3);
                   auto x = (c.batch_first ? torch::randn({2, 3, 4}) : torch::randn({3, 2, 4})).to(d);
                   auto h0 = torch::randn({c.layers * dirs, 2, 5}).to(d);
                   at::Tensor out;
                   if (auto* r = dynamic_cast<nn::RNNImpl*>(&m)) out = std::get<0>(c.initial ? r->forward(x, h0) : r->forward(x));
                   if (auto* g = dynamic_cast<nn::GRUImpl*>(&m)) out = std::get<0>(c.initial ? g->forward(x, h0) : g->forward(x));
                   if (auto* l = dynamic_cast<nn::LSTMImpl*>(&m)) {
                     auto c0 = torch::randn({c.layers * dirs, 2, 5}).to(d);
                     out = std::get<0>(c.initial ? l->forward(x, std::make_tuple(h0, c0)) : l->forward(x));
                   }
                   return (out * out).mean();
                 }});
  }
  // The losses with class weights.
  auto loss_entry = [](std::string name, std::function<std::shared_ptr<nn::Module>()> make) -> Entry {
    return {name, make, [](nn::Module& m, const c10::Device& d) {
              torch::manual_seed(3);
              auto logits = torch::randn({4, 3}).to(d).requires_grad_();
              if (auto* n = dynamic_cast<nn::NLLLossImpl*>(&m)) return n->forward(torch::log_softmax(logits, 1), torch::tensor({0, 2, 1, 2}).to(d));
              if (auto* c = dynamic_cast<nn::CrossEntropyLossImpl*>(&m)) return c->forward(logits, torch::tensor({0, 2, 1, 2}).to(d));
              auto* b = dynamic_cast<nn::BCEWithLogitsLossImpl*>(&m);
              return b->forward(logits, torch::rand({4, 3}).to(d));
            }};
  };
  e.push_back(loss_entry("NLLLoss", [] { return nn::NLLLoss(nn::NLLLossOptions().weight(torch::tensor({1.0, 2.0, 0.5}))).ptr(); }));
  e.push_back(loss_entry("CrossEntropyLoss",
                         [] { return nn::CrossEntropyLoss(nn::CrossEntropyLossOptions().weight(torch::tensor({1.0, 2.0, 0.5}))).ptr(); }));
  e.push_back(loss_entry("BCEWithLogitsLoss",
                         [] { return nn::BCEWithLogitsLoss(nn::BCEWithLogitsLossOptions().pos_weight(torch::tensor({1.0, 2.0, 0.5}))).ptr(); }));
  return e;
}

// The loss and every parameter's gradient, flattened, on the CPU.
at::Tensor loss_and_grads(nn::Module& m, const Entry& entry, const c10::Device& device) {
  at::Tensor loss = entry.loss(m, device);
  if (loss.requires_grad()) loss.backward();  // a module without parameters and inputs without grad: forward only
  std::vector<at::Tensor> parts{loss.detach().to(torch::kCPU).reshape({1})};
  for (const auto& p : m.parameters()) {
    if (p.grad().defined()) parts.push_back(p.grad().to(torch::kCPU).reshape({-1}));
  }
  return torch::cat(parts);
}

// In a child process: 0 when the entry's loss and gradients on xla match eager, 1 (with the
// difference on stderr) when they do not, 2 when it threw (the message on stderr).
int run_entry(const Entry& entry) {
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::alarm(120);  // a hang fails this entry (SIGALRM) instead of the whole test
    try {
      torch::manual_seed(1);
      auto eager = entry.make();
      torch::manual_seed(1);
      auto lazy = entry.make();
      const at::Tensor want = loss_and_grads(*eager, entry, c10::Device(c10::kCPU));
      const c10::Device dev = xla::backend().device();
      move_module(*lazy, dev);
      const at::Tensor got = loss_and_grads(*lazy, entry, dev);
      // What did not compile with XLA (for the list in module_mover.h): graphs kept on
      // TorchScript by op, and ops the lazy core ran on the host.
      std::string off;
      for (const auto& [op, n] : xla::metrics().xla_fallbacks) off += " " + op;
      for (const auto& [op, n] : xla::metrics().eager_fallbacks) off += " host:" + op;
      std::fprintf(stderr, "module matrix: %s ran%s\n", entry.name.c_str(), off.empty() ? " all on XLA" : (":" + off).c_str());
      if (got.sizes() != want.sizes() || !torch::allclose(got, want, entry.tol, entry.tol)) {
        std::fprintf(stderr, "%s: xla %s\neager %s\n", entry.name.c_str(), c10::str(got).c_str(), c10::str(want).c_str());
        std::_Exit(1);
      }
      std::_Exit(0);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s: %s\n", entry.name.c_str(), e.what());
      std::_Exit(2);
    }
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (WIFSIGNALED(status)) return 100 + WTERMSIG(status);
  return WEXITSTATUS(status);
}

}  // namespace

// A GRU, an LSTM and an RNN language head trained 20 SGD steps on xla (in a child process) end
// with eager's parameters.
TEST(ModuleMatrix, RecurrentModelsTrainTwentyStepsOnXlaAsOnEager) {
  for (const std::string kind : {"GRU", "LSTM", "RNN"}) {
    std::fflush(nullptr);
    const pid_t pid = ::fork();
    if (pid == 0) {
      try {
        auto train = [&](const c10::Device& dev) {
          torch::manual_seed(4);
          nn::Sequential net;
          std::shared_ptr<nn::Module> rnn;
          if (kind == "GRU") rnn = nn::GRU(nn::GRUOptions(3, 6).num_layers(2).batch_first(true)).ptr();
          if (kind == "LSTM") rnn = nn::LSTM(nn::LSTMOptions(3, 6).bidirectional(true).batch_first(true)).ptr();
          if (kind == "RNN") rnn = nn::RNN(nn::RNNOptions(3, 6).batch_first(true)).ptr();
          nn::Linear head(kind == "LSTM" ? 12 : 6, 1);
          auto holder = std::make_shared<nn::Module>();
          holder->register_module("rnn", rnn);
          holder->register_module("head", head.ptr());
          move_module(*holder, dev);
          torch::optim::SGD sgd(holder->parameters(), torch::optim::SGDOptions(0.1));
          auto gen = at::make_generator<at::CPUGeneratorImpl>(9);
          for (int step = 0; step < 20; ++step) {
            auto x = at::randn({4, 5, 3}, gen).to(dev), y = at::randn({4, 1}, gen).to(dev);
            at::Tensor seq;
            if (auto* g = dynamic_cast<nn::GRUImpl*>(rnn.get())) seq = std::get<0>(g->forward(x));
            if (auto* l = dynamic_cast<nn::LSTMImpl*>(rnn.get())) seq = std::get<0>(l->forward(x));
            if (auto* r = dynamic_cast<nn::RNNImpl*>(rnn.get())) seq = std::get<0>(r->forward(x));
            auto loss = torch::mse_loss(head->forward(seq.select(1, -1)), y);
            sgd.zero_grad();
            loss.backward();
            sgd.step();
            if (dev.type() == c10::kLazy) xla::mark_step();
          }
          std::vector<at::Tensor> flat;
          for (const auto& p : holder->parameters()) flat.push_back(p.detach().to(torch::kCPU).reshape({-1}));
          return torch::cat(flat);
        };
        const at::Tensor eager = train(c10::Device(c10::kCPU));
        const at::Tensor lazy = train(xla::backend().device());
        const double diff = (eager - lazy).abs().max().item<double>();
        std::fprintf(stderr, "%s: largest parameter difference after 20 steps %g\n", kind.c_str(), diff);
        std::_Exit(diff <= 1e-4 ? 0 : 1);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "%s: %s\n", kind.c_str(), e.what());
        std::_Exit(2);
      }
    }
    int status = 0;
    ::waitpid(pid, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << kind << ": status " << status;
  }
}

TEST(ModuleMatrix, EveryModuleTheMoverListsRunsOnXlaAndMatchesEager) {
  for (const Entry& entry : matrix()) {
    std::fprintf(stderr, "module matrix: %s\n", entry.name.c_str());
    const int rc = run_entry(entry);
    EXPECT_EQ(rc, 0) << entry.name << (rc >= 100 ? ": killed by signal " + std::to_string(rc - 100)
                                                  : rc == 1 ? ": differs from eager" : ": threw");
  }
}

// The dropout modules (no member tensors, so not in the mover's list) draw their masks on the
// device (<fulgur/xla/random.h>): nothing leaves XLA, in training each element (Dropout,
// AlphaDropout) or each channel (Dropout2d, FeatureAlphaDropout) is kept and scaled or dropped,
// the input's gradient goes through the same mask, and in evaluation each module is the identity,
// as on eager.
TEST(ModuleMatrix, DropoutModulesStayOnXla) {
  const c10::Device dev = xla::backend().device();
  xla::manual_seed(1);
  torch::manual_seed(2);
  const at::Tensor x_cpu = torch::rand({8, 16, 4, 4}) + 0.5;
  struct Case {
    std::string name;
    std::shared_ptr<nn::Module> module;
    std::function<at::Tensor(nn::Module&, const at::Tensor&)> forward;
  };
  std::vector<Case> cases = {
      {"Dropout", nn::Dropout(0.25).ptr(), [](nn::Module& m, const at::Tensor& x) { return dynamic_cast<nn::DropoutImpl&>(m).forward(x); }},
      {"Dropout2d", nn::Dropout2d(0.25).ptr(), [](nn::Module& m, const at::Tensor& x) { return dynamic_cast<nn::Dropout2dImpl&>(m).forward(x); }},
      {"AlphaDropout", nn::AlphaDropout(0.25).ptr(), [](nn::Module& m, const at::Tensor& x) { return dynamic_cast<nn::AlphaDropoutImpl&>(m).forward(x); }},
      {"FeatureAlphaDropout", nn::FeatureAlphaDropout(0.25).ptr(),
       [](nn::Module& m, const at::Tensor& x) { return dynamic_cast<nn::FeatureAlphaDropoutImpl&>(m).forward(x); }},
  };
  for (auto& c : cases) {
    SCOPED_TRACE(c.name);
    const xla::BackendMetrics before = xla::metrics();
    c.module->train();
    const at::Tensor x = x_cpu.to(dev).requires_grad_();
    const at::Tensor y = c.forward(*c.module, x);
    y.sum().backward();
    c.module->eval();
    const at::Tensor e = c.forward(*c.module, x_cpu.to(dev));
    xla::mark_step();
    std::string off;
    for (const auto& [op, n] : xla::metrics().xla_fallbacks)
      if (!before.xla_fallbacks.count(op) || before.xla_fallbacks.at(op) != n) off += " " + op;
    for (const auto& [op, n] : xla::metrics().eager_fallbacks)
      if (!before.eager_fallbacks.count(op) || before.eager_fallbacks.at(op) != n) off += " host:" + op;
    EXPECT_EQ(off, "") << xla::metrics_report();
    EXPECT_TRUE(torch::equal(e.cpu(), x_cpu)) << "evaluation is the identity";
    // y = a * x * keep + b(keep) elementwise, with a and b constant: dy/dx = a * keep. Where
    // the gradient is 0 the element was dropped; elsewhere y / x is the common scale (plus
    // AlphaDropout's shift), and the dropped fraction is about p.
    const at::Tensor g = x.grad().cpu(), yc = y.detach().cpu();
    const at::Tensor kept = g != 0;
    const double fraction = kept.to(torch::kDouble).mean().item<double>();
    EXPECT_GT(fraction, 0.55);
    EXPECT_LT(fraction, 0.95);
    const at::Tensor scale = g.masked_select(kept);
    EXPECT_TRUE(torch::allclose(scale, scale[0].expand_as(scale))) << "one scale for every kept element";
    const at::Tensor shift = (yc - g * x_cpu);  // b: one value where kept, one where dropped
    const at::Tensor kept_shift = shift.masked_select(kept), dropped_shift = shift.masked_select(kept.logical_not());
    EXPECT_TRUE(torch::allclose(kept_shift, kept_shift[0].expand_as(kept_shift), 1e-5, 1e-5));
    EXPECT_TRUE(torch::allclose(dropped_shift, dropped_shift[0].expand_as(dropped_shift), 1e-5, 1e-5));
    if (c.name.find("2d") != std::string::npos || c.name.find("Feature") != std::string::npos) {
      // A channel is kept or dropped whole.
      const at::Tensor per_channel = kept.reshape({8, 16, 16}).to(torch::kFloat).mean(2);
      EXPECT_TRUE(torch::equal(per_channel, per_channel.round())) << "a channel partly dropped";
    }
  }
}
