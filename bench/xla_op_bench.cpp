// Where the MNIST CNN's xla step spends its time: each convolution of its training step alone
// (forward, the input gradient, the weight gradient, the shapes of batch 64), then the whole
// forward, forward+backward and optimizer graphs, each on the xla device (traced, emitted as
// StableHLO and compiled by the PJRT plugin, or run by the TorchScript backend, as
// FULGUR_XLA_BACKEND says) and eagerly on the CPU. Prints the median wall time of --reps runs
// after --warmup, each run ending with its result on the host.
//   build/bin/xla_op_bench --reps 30
//   XLA_FLAGS=--xla_cpu_enable_fast_math=true build/bin/xla_op_bench   (the plugin's own flags)
#include "mnist/mnist_module.h"

#include <fulgur/xla/backend.h>
#include <fulgur/module_mover.h>

#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

double median_ms(int warmup, int reps, const std::function<void()>& run) {
  for (int i = 0; i < warmup; ++i) run();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = Clock::now();
    run();
    t.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// One convolution of the CNN: input [n, c, h, w], kernel [o, c, 5, 5], padding 2, stride 1.
struct Conv {
  const char* name;
  int64_t n, c, h, w, o;
};

at::Tensor conv_backward(const at::Tensor& grad, const at::Tensor& x, const at::Tensor& w, std::array<bool, 3> mask,
                         int which) {
  auto r = at::convolution_backward(grad, x, w, c10::IntArrayRef{w.size(0)}, {1, 1}, {2, 2}, {1, 1}, false, {0, 0}, 1,
                                    mask);
  return which == 0 ? std::get<0>(r) : std::get<1>(r);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"the MNIST CNN's convolutions and graphs on the xla device against eager"};
  int reps = 30, warmup = 5;
  int64_t batch = 64;
  app.add_option("--reps", reps, "timed runs per row (median)");
  app.add_option("--warmup", warmup, "untimed runs first (the xla side compiles in the first)");
  app.add_option("--batch", batch, "batch size");
  CLI11_PARSE(app, argc, argv);

  auto& backend = fulgur::xla::backend();
  const c10::Device dev = backend.device();
  const char* flags = std::getenv("XLA_FLAGS");
  std::printf("backend %s, XLA_FLAGS=%s, torch threads %d, batch %lld\n", backend.name().c_str(),
              flags ? flags : "", at::get_num_threads(), static_cast<long long>(batch));
  std::printf("%-34s %10s %10s %8s\n", "op", "xla ms", "eager ms", "ratio");
  auto row = [&](const std::string& name, const std::function<at::Tensor(bool)>& op) {
    const double x = median_ms(warmup, reps, [&] {
      at::Tensor r = op(true);
      fulgur::xla::mark_step();
      (void)r.cpu();
    });
    const double e = median_ms(warmup, reps, [&] { (void)op(false); });
    std::printf("%-34s %10.3f %10.3f %8.2f\n", name.c_str(), x, e, x / e);
    std::fflush(stdout);
  };

  torch::manual_seed(0);
  for (const Conv& c : {Conv{"conv1", batch, 1, 28, 28, 16}, Conv{"conv2", batch, 16, 14, 14, 32}}) {
    const at::Tensor x = at::randn({c.n, c.c, c.h, c.w}), w = at::randn({c.o, c.c, 5, 5}), b = at::randn({c.o});
    const at::Tensor g = at::randn({c.n, c.o, c.h, c.w});
    at::Tensor xd = x.to(dev), wd = w.to(dev), bd = b.to(dev), gd = g.to(dev);
    fulgur::xla::mark_step();
    auto on = [&](bool xla, const at::Tensor& d, const at::Tensor& h) { return xla ? d : h; };
    row(std::string(c.name) + " forward", [&](bool xla) {
      return at::convolution(on(xla, xd, x), on(xla, wd, w), on(xla, bd, b), {1, 1}, {2, 2}, {1, 1}, false, {0, 0}, 1);
    });
    if (c.c > 1) {
      row(std::string(c.name) + " grad input", [&](bool xla) {
        return conv_backward(on(xla, gd, g), on(xla, xd, x), on(xla, wd, w), {true, false, false}, 0);
      });
    }
    row(std::string(c.name) + " grad weight", [&](bool xla) {
      return conv_backward(on(xla, gd, g), on(xla, xd, x), on(xla, wd, w), {false, true, false}, 1);
    });
  }

  // The whole model: forward (no grad), forward + loss + backward, Adam's update.
  for (bool xla : {true, false}) {
    torch::manual_seed(0);
    auto model = std::make_shared<mnist::CNN>();
    const c10::Device d = xla ? dev : c10::Device(c10::kCPU);
    if (xla) fulgur::move_module(*model, d);
    torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(1e-3));
    const at::Tensor images = at::rand({batch, 1, 28, 28}).to(d), labels = at::randint(0, 10, {batch}).to(d);
    auto sync = [&](const at::Tensor& t) {
      if (xla) fulgur::xla::mark_step();
      (void)t.cpu();
    };
    const double fwd = median_ms(warmup, reps, [&] {
      torch::NoGradGuard no_grad;
      sync(model->forward(images));
    });
    const double fwbw = median_ms(warmup, reps, [&] {
      adam.zero_grad();
      at::Tensor loss = torch::cross_entropy_loss(model->forward(images), labels);
      loss.backward();
      sync(model->conv1->weight.grad());
    });
    const double opt = median_ms(warmup, reps, [&] {
      adam.step();
      if (xla) fulgur::xla::apply_pending_updates(model->parameters());
      sync(model->conv1->weight);
    });
    std::printf("CNN graphs, %-5s: forward %.3f ms, forward+backward %.3f ms, optimizer %.3f ms\n",
                xla ? "xla" : "eager", fwd, fwbw, opt);
  }
  return 0;
}
