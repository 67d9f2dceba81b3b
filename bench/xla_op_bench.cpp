// SPDX-License-Identifier: Apache-2.0
// Where the MNIST CNN's xla step spends its time: each convolution of its training step alone
// (forward, the input gradient, the weight gradient, the shapes of batch 64) and each max-pool
// (forward with indices, the input gradient), then the whole
// forward, forward+backward and optimizer graphs, each on the xla device (traced, emitted as
// StableHLO and compiled by the PJRT plugin, or run by the TorchScript backend, as
// FULGUR_XLA_BACKEND says) and eagerly on the CPU. Prints the median wall time of --reps runs
// after --warmup, each run ending with its result on the host. With the pjrt backend it first
// compares lowerings of conv1's forward (1 input channel), each a hand-written StableHLO module
// compiled by the plugin, against eager, their runs interleaved (--lowerings-only stops there).
//   build/bin/xla_op_bench --reps 30
//   XLA_FLAGS=--xla_cpu_enable_fast_math=true build/bin/xla_op_bench   (the plugin's own flags)
#include "mnist/mnist_module.h"

#include <fulgur/xla/backend.h>
#include "xla/pjrt/client.h"
#include "xla/pjrt/tensors.h"
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

// StableHLO text of a [n, c, h, w] x [o, c, k, k] convolution (stride 1, padding k / 2, no
// bias) written in one of the ways compared below; returns the module.
struct ConvShape {
  int64_t n, c, h, w, o, k;
};

std::string tensor(const std::vector<int64_t>& d) {
  std::string s = "tensor<";
  for (int64_t x : d) s += std::to_string(x) + "x";
  return s + "f32>";
}

std::string list(const std::vector<int64_t>& d) {
  std::string s;
  for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s;
}

std::string conv_attrs(const std::string& layout, int64_t pad) {
  const std::string p = std::to_string(pad);
  return "{batch_group_count = 1 : i64, dimension_numbers = #stablehlo.conv<" + layout +
         ">, feature_group_count = 1 : i64, lhs_dilation = array<i64: 1, 1>, padding = dense<[[" + p + ", " + p +
         "], [" + p + ", " + p + "]]> : tensor<2x2xi64>, rhs_dilation = array<i64: 1, 1>, window_strides = array<i64: "
         "1, 1>}";
}

std::string module(const ConvShape& s, const std::string& body, const std::string& result) {
  const auto x = tensor({s.n, s.c, s.h, s.w}), w = tensor({s.o, s.c, s.k, s.k}), y = tensor({s.n, s.o, s.h, s.w});
  return "module {\n  func.func @main(%x: " + x + ", %w: " + w + ") -> (" + y + ") {\n" + body +
         "    \"func.return\"(" + result + ") : (" + y + ") -> ()\n  }\n}\n";
}

// Today's emitter: one stablehlo.convolution in PyTorch's NCHW / OIHW layout.
std::string conv_nchw(const ConvShape& s) {
  return module(s,
                "    %y = \"stablehlo.convolution\"(%x, %w) " + conv_attrs("[b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1]", s.k / 2) +
                    " : (" + tensor({s.n, s.c, s.h, s.w}) + ", " + tensor({s.o, s.c, s.k, s.k}) + ") -> " +
                    tensor({s.n, s.o, s.h, s.w}) + "\n",
                "%y");
}

// The same convolution on NHWC / HWIO operands (the layout of Eigen's spatial convolution),
// transposed in and out.
std::string conv_nhwc(const ConvShape& s) {
  const auto xt = tensor({s.n, s.h, s.w, s.c}), wt = tensor({s.k, s.k, s.c, s.o}), yt = tensor({s.n, s.h, s.w, s.o});
  return module(s,
                "    %xt = \"stablehlo.transpose\"(%x) {permutation = array<i64: 0, 2, 3, 1>} : (" +
                    tensor({s.n, s.c, s.h, s.w}) + ") -> " + xt + "\n" +
                    "    %wt = \"stablehlo.transpose\"(%w) {permutation = array<i64: 2, 3, 1, 0>} : (" +
                    tensor({s.o, s.c, s.k, s.k}) + ") -> " + wt + "\n" +
                    "    %yt = \"stablehlo.convolution\"(%xt, %wt) " +
                    conv_attrs("[b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f]", s.k / 2) + " : (" + xt + ", " + wt + ") -> " +
                    yt + "\n" + "    %y = \"stablehlo.transpose\"(%yt) {permutation = array<i64: 0, 3, 1, 2>} : (" +
                    yt + ") -> " + tensor({s.n, s.o, s.h, s.w}) + "\n",
                "%y");
}

// The input features zero-padded to `c` (and the kernel's with them), then today's convolution.
std::string conv_padded_features(const ConvShape& s, int64_t c) {
  const auto xp = tensor({s.n, c, s.h, s.w}), wp = tensor({s.o, c, s.k, s.k});
  const std::string extra = std::to_string(c - s.c);
  return module(s,
                "    %z = \"stablehlo.constant\"() {value = dense<0.0> : tensor<f32>} : () -> tensor<f32>\n"
                "    %xp = \"stablehlo.pad\"(%x, %z) {edge_padding_high = array<i64: 0, " + extra +
                    ", 0, 0>, edge_padding_low = array<i64: 0, 0, 0, 0>, interior_padding = array<i64: 0, 0, 0, 0>} : (" +
                    tensor({s.n, s.c, s.h, s.w}) + ", tensor<f32>) -> " + xp + "\n" +
                    "    %wp = \"stablehlo.pad\"(%w, %z) {edge_padding_high = array<i64: 0, " + extra +
                    ", 0, 0>, edge_padding_low = array<i64: 0, 0, 0, 0>, interior_padding = array<i64: 0, 0, 0, 0>} : (" +
                    tensor({s.o, s.c, s.k, s.k}) + ", tensor<f32>) -> " + wp + "\n" +
                    "    %y = \"stablehlo.convolution\"(%xp, %wp) " +
                    conv_attrs("[b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1]", s.k / 2) + " : (" + xp + ", " + wp + ") -> " +
                    tensor({s.n, s.o, s.h, s.w}) + "\n",
                "%y");
}

// %xp: the input [n, c, h, w] zero-padded by p on both spatial sides (the start of every
// hand-written lowering below).
std::string padded_input(const ConvShape& s, int64_t c, int64_t p) {
  return "    %z = \"stablehlo.constant\"() {value = dense<0.0> : tensor<f32>} : () -> tensor<f32>\n"
         "    %xp = \"stablehlo.pad\"(%x, %z) {edge_padding_high = array<i64: 0, 0, " + list({p, p}) +
         ">, edge_padding_low = array<i64: 0, 0, " + list({p, p}) +
         ">, interior_padding = array<i64: 0, 0, 0, 0>} : (" + tensor({s.n, c, s.h, s.w}) + ", tensor<f32>) -> " +
         tensor({s.n, c, s.h + 2 * p, s.w + 2 * p}) + "\n";
}

// %s<id>: the window of %xp shifted by (i, j), [n, c, h, w].
std::string shifted_window(const ConvShape& s, int64_t c, int64_t p, int64_t i, int64_t j, const std::string& id) {
  return "    %s" + id + " = \"stablehlo.slice\"(%xp) {limit_indices = array<i64: " + list({s.n, c, i + s.h, j + s.w}) +
         ">, start_indices = array<i64: 0, 0, " + list({i, j}) + ">, strides = array<i64: 1, 1, 1, 1>} : (" +
         tensor({s.n, c, s.h + 2 * p, s.w + 2 * p}) + ") -> " + tensor({s.n, c, s.h, s.w}) + "\n";
}

// The k*k shifted windows of the padded input ([n, c, h, w] each; with `batch_after_features`
// transposed to [c, n, h, w] first), each reshaped to `win` as %r<id> and concatenated along
// `dim` into %cat of type `stacked`: the columns both im2col lowerings below start from.
std::string stacked_windows(const ConvShape& s, const std::vector<int64_t>& win, int64_t dim,
                            const std::string& stacked, bool batch_after_features) {
  const int64_t p = s.k / 2;
  std::string b = padded_input(s, s.c, p);
  std::string cat = "    %cat = \"stablehlo.concatenate\"(";
  std::string types;
  for (int64_t i = 0; i < s.k; ++i)
    for (int64_t j = 0; j < s.k; ++j) {
      const std::string id = std::to_string(i * s.k + j);
      b += shifted_window(s, s.c, p, i, j, id);
      std::string from = "%s" + id, from_type = tensor({s.n, s.c, s.h, s.w});
      if (batch_after_features) {
        b += "    %t" + id + " = \"stablehlo.transpose\"(%s" + id + ") {permutation = array<i64: 1, 0, 2, 3>} : (" +
             from_type + ") -> " + tensor({s.c, s.n, s.h, s.w}) + "\n";
        from = "%t" + id;
        from_type = tensor({s.c, s.n, s.h, s.w});
      }
      b += "    %r" + id + " = \"stablehlo.reshape\"(" + from + ") : (" + from_type + ") -> " + tensor(win) + "\n";
      cat += (i + j ? ", %r" : "%r") + id;
      types += (i + j ? ", " : "") + tensor(win);
    }
  return b + cat + ") {dimension = " + std::to_string(dim) + " : i64} : (" + types + ") -> " + stacked + "\n";
}

// im2col: the k*k shifted windows of the padded input (slices), stacked into
// [n, c*k*k, h*w], then one batched dot with the kernel as [o, c*k*k]; no transpose.
std::string conv_im2col(const ConvShape& s) {
  const int64_t kk = s.k * s.k;
  const auto stacked = tensor({s.n, s.c, kk, s.h, s.w}), cols = tensor({s.n, s.c * kk, s.h * s.w});
  std::string b = stacked_windows(s, {s.n, s.c, 1, s.h, s.w}, 2, stacked, false);
  b += "    %cols = \"stablehlo.reshape\"(%cat) : (" + stacked + ") -> " + cols + "\n";
  b += "    %w2 = \"stablehlo.reshape\"(%w) : (" + tensor({s.o, s.c, s.k, s.k}) + ") -> " + tensor({s.o, s.c * kk}) + "\n";
  b += "    %wb = \"stablehlo.broadcast_in_dim\"(%w2) {broadcast_dimensions = array<i64: 1, 2>} : (" +
       tensor({s.o, s.c * kk}) + ") -> " + tensor({s.n, s.o, s.c * kk}) + "\n";
  b += "    %d = \"stablehlo.dot_general\"(%wb, %cols) {dot_dimension_numbers = #stablehlo.dot<lhs_batching_dimensions "
       "= [0], rhs_batching_dimensions = [0], lhs_contracting_dimensions = [2], rhs_contracting_dimensions = [1]>} : (" +
       tensor({s.n, s.o, s.c * kk}) + ", " + cols + ") -> " + tensor({s.n, s.o, s.h * s.w}) + "\n";
  b += "    %y = \"stablehlo.reshape\"(%d) : (" + tensor({s.n, s.o, s.h * s.w}) + ") -> " +
       tensor({s.n, s.o, s.h, s.w}) + "\n";
  return module(s, b, "%y");
}

// The same im2col, but one unbatched dot of [o, c*k*k] with [c*k*k, n*h*w] (the batch moved
// next to the spatial dims), transposed back to [n, o, h, w].
std::string conv_im2col_gemm(const ConvShape& s) {
  const int64_t kk = s.k * s.k;
  const auto stacked = tensor({s.c, kk, s.n, s.h, s.w}), cols = tensor({s.c * kk, s.n * s.h * s.w});
  std::string b = stacked_windows(s, {s.c, 1, s.n, s.h, s.w}, 1, stacked, true);
  b += "    %cols = \"stablehlo.reshape\"(%cat) : (" + stacked + ") -> " + cols + "\n";
  b += "    %w2 = \"stablehlo.reshape\"(%w) : (" + tensor({s.o, s.c, s.k, s.k}) + ") -> " + tensor({s.o, s.c * kk}) + "\n";
  b += "    %d = \"stablehlo.dot_general\"(%w2, %cols) {dot_dimension_numbers = #stablehlo.dot<"
       "lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]>} : (" +
       tensor({s.o, s.c * kk}) + ", " + cols + ") -> " + tensor({s.o, s.n * s.h * s.w}) + "\n";
  b += "    %d4 = \"stablehlo.reshape\"(%d) : (" + tensor({s.o, s.n * s.h * s.w}) + ") -> " +
       tensor({s.o, s.n, s.h, s.w}) + "\n";
  b += "    %y = \"stablehlo.transpose\"(%d4) {permutation = array<i64: 1, 0, 2, 3>} : (" +
       tensor({s.o, s.n, s.h, s.w}) + ") -> " + tensor({s.n, s.o, s.h, s.w}) + "\n";
  return module(s, b, "%y");
}

// One input channel only: the sum over the k*k kernel taps of a shifted window of the padded
// input (a slice, broadcast over the output features) times that tap's weights (broadcast over
// batch and space), all elementwise, so that XLA fuses it into one loop. With `features_minor`
// the sum is made as [n, h, w, o] (each tap a vector of o weights times one input value) and
// transposed to [n, o, h, w] at the end.
std::string conv_shifted_sum(const ConvShape& s, bool features_minor) {
  const int64_t p = s.k / 2;
  const auto y = features_minor ? tensor({s.n, s.h, s.w, s.o}) : tensor({s.n, s.o, s.h, s.w});
  const std::string window_dims = features_minor ? "0, 3, 1, 2" : "0, 1, 2, 3";
  const std::string tap_dims = features_minor ? "3, 0" : "1, 0";
  std::string b = padded_input(s, 1, p);
  b += "    %w2 = \"stablehlo.reshape\"(%w) : (" + tensor({s.o, 1, s.k, s.k}) + ") -> " + tensor({s.o, s.k * s.k}) + "\n";
  std::string acc;
  for (int64_t i = 0; i < s.k; ++i)
    for (int64_t j = 0; j < s.k; ++j) {
      const std::string id = std::to_string(i * s.k + j);
      b += shifted_window(s, 1, p, i, j, id);
      b += "    %sb" + id + " = \"stablehlo.broadcast_in_dim\"(%s" + id + ") {broadcast_dimensions = array<i64: " +
           window_dims + ">} : (" + tensor({s.n, 1, s.h, s.w}) + ") -> " + y + "\n";
      b += "    %t" + id + " = \"stablehlo.slice\"(%w2) {limit_indices = array<i64: " + list({s.o, i * s.k + j + 1}) +
           ">, start_indices = array<i64: 0, " + id + ">, strides = array<i64: 1, 1>} : (" + tensor({s.o, s.k * s.k}) +
           ") -> " + tensor({s.o, 1}) + "\n";
      b += "    %tb" + id + " = \"stablehlo.broadcast_in_dim\"(%t" + id + ") {broadcast_dimensions = array<i64: " +
           tap_dims + ">} : (" + tensor({s.o, 1}) + ") -> " + y + "\n";
      b += "    %m" + id + " = \"stablehlo.multiply\"(%sb" + id + ", %tb" + id + ") : (" + y + ", " + y + ") -> " + y + "\n";
      if (acc.empty()) {
        acc = "%m" + id;
      } else {
        b += "    %acc" + id + " = \"stablehlo.add\"(" + acc + ", %m" + id + ") : (" + y + ", " + y + ") -> " + y + "\n";
        acc = "%acc" + id;
      }
    }
  if (!features_minor) return module(s, b, acc);
  b += "    %y = \"stablehlo.transpose\"(" + acc + ") {permutation = array<i64: 0, 3, 1, 2>} : (" + y + ") -> " +
       tensor({s.n, s.o, s.h, s.w}) + "\n";
  return module(s, b, "%y");
}

// The floor of every xla row: a trivial program with the output's shape (the input broadcast
// over the output features; one input channel), executed and downloaded.
std::string output_floor(const ConvShape& s) {
  return module(s,
                "    %y = \"stablehlo.broadcast_in_dim\"(%x) {broadcast_dimensions = array<i64: 0, 1, 2, 3>} : (" +
                    tensor({s.n, 1, s.h, s.w}) + ") -> " + tensor({s.n, s.o, s.h, s.w}) + "\n",
                "%y");
}

// conv1's forward written each way above, compiled by the plugin and run on the same device
// buffers, against eager at::convolution; the runs of all of them interleaved so that a loaded
// machine slows each alike. Checks each result against eager first.
void compare_lowerings(const ConvShape& s, int warmup, int reps) {
  namespace pjrt = fulgur::xla::pjrt;
  const pjrt::Client& client = pjrt::process_client();
  const at::Tensor x = at::randn({s.n, s.c, s.h, s.w}), w = at::randn({s.o, s.c, s.k, s.k});
  const pjrt::Buffer xb = pjrt::to_device(client, x), wb = pjrt::to_device(client, w);
  const at::Tensor ref = at::convolution(x, w, {}, {1, 1}, {s.k / 2, s.k / 2}, {1, 1}, false, {0, 0}, 1);
  struct Variant {
    std::string name;
    std::function<void()> run;
  };
  std::vector<Variant> variants;
  std::vector<std::shared_ptr<pjrt::Executable>> keep;
  variants.push_back({"eager at::convolution", [&] {
                        (void)at::convolution(x, w, {}, {1, 1}, {s.k / 2, s.k / 2}, {1, 1}, false, {0, 0}, 1);
                      }});
  auto add = [&](const std::string& name, const std::string& text, bool check = true) {
    auto exe = std::make_shared<pjrt::Executable>(client.compile(text));
    keep.push_back(exe);
    const at::Tensor got = pjrt::to_tensor(exe->execute({&xb, &wb}).at(0));
    const double err = (got - ref).abs().max().item<double>();
    if (check) std::printf("  %-38s max |xla - eager| %.2e (max |eager| %.1f)\n", name.c_str(), err, ref.abs().max().item<double>());
    if (check && err > 1e-3) throw std::runtime_error(name + ": result differs from eager by " + std::to_string(err));
    variants.push_back({name, [exe, &xb, &wb] { (void)pjrt::to_tensor(exe->execute({&xb, &wb}).at(0)); }});
  };
  std::printf("conv [%lld, %lld, %lld, %lld] x [%lld, %lld, %lld, %lld], padding %lld: lowerings\n",
              static_cast<long long>(s.n), static_cast<long long>(s.c), static_cast<long long>(s.h),
              static_cast<long long>(s.w), static_cast<long long>(s.o), static_cast<long long>(s.c),
              static_cast<long long>(s.k), static_cast<long long>(s.k), static_cast<long long>(s.k / 2));
  add("convolution NCHW (today)", conv_nchw(s));
  add("convolution NHWC/HWIO, transposed", conv_nhwc(s));
  if (s.c < 8) add("convolution, features padded to 8", conv_padded_features(s, 8));
  add("im2col + batched dot_general", conv_im2col(s));
  add("im2col + one dot_general + transpose", conv_im2col_gemm(s));
  if (s.c == 1) {
    add("sum of k*k shifted windows x taps", conv_shifted_sum(s, false));
    add("the same, features minor + transpose", conv_shifted_sum(s, true));
    add("floor: output-sized broadcast", output_floor(s), false);
  }
  std::vector<std::vector<double>> t(variants.size());
  for (int r = 0; r < warmup + reps; ++r)
    for (size_t v = 0; v < variants.size(); ++v) {
      const auto t0 = Clock::now();
      variants[v].run();
      if (r >= warmup) t[v].push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const double eager = median(t[0]);
  std::printf("  %-38s %10s %8s %10s\n", "lowering (xla: execute + download)", "median ms", "/ eager", "/ today");
  for (size_t v = 0; v < variants.size(); ++v) {
    const double m = median(t[v]);
    std::printf("  %-38s %10.3f %8.2f %10.2f\n", variants[v].name.c_str(), m, m / eager, m / median(t[1]));
  }
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"the MNIST CNN's convolutions and graphs on the xla device against eager"};
  int reps = 30, warmup = 5;
  int64_t batch = 64;
  app.add_option("--reps", reps, "timed runs per row (median)");
  app.add_option("--warmup", warmup, "untimed runs first (the xla side compiles in the first)");
  app.add_option("--batch", batch, "batch size");
  bool lowerings_only = false;
  app.add_flag("--lowerings-only", lowerings_only, "stop after the comparison of conv1 lowerings");
  CLI11_PARSE(app, argc, argv);

  auto& backend = fulgur::xla::backend();
  const c10::Device dev = backend.device();
  const char* flags = std::getenv("XLA_FLAGS");
  std::printf("backend %s, XLA_FLAGS=%s, torch threads %d, batch %lld\n", backend.name().c_str(),
              flags ? flags : "", at::get_num_threads(), static_cast<long long>(batch));
  if (backend.name() == "pjrt") {
    torch::manual_seed(0);
    compare_lowerings({batch, 1, 28, 28, 16, 5}, warmup, reps);
    compare_lowerings({batch, 16, 14, 14, 32, 5}, warmup, reps);
  }
  if (lowerings_only) return 0;
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

  // The CNN's two max-pools (2x2, stride 2) after each convolution: forward with indices, and
  // the input gradient from those indices.
  struct Pool {
    const char* name;
    int64_t channels, side;
  };
  for (const Pool& c : {Pool{"pool1", 16, 28}, Pool{"pool2", 32, 14}}) {
    const at::Tensor x = at::randn({batch, c.channels, c.side, c.side});
    const at::Tensor g = at::randn({batch, c.channels, c.side / 2, c.side / 2});
    const at::Tensor idx = std::get<1>(at::max_pool2d_with_indices(x, {2, 2}, {2, 2}));
    at::Tensor xd = x.to(dev), gd = g.to(dev), idxd = idx.to(dev);
    fulgur::xla::mark_step();
    row(std::string(c.name) + " forward", [&](bool xla) {
      return std::get<0>(at::max_pool2d_with_indices(xla ? xd : x, {2, 2}, {2, 2}));
    });
    row(std::string(c.name) + " grad input", [&](bool xla) {
      return at::max_pool2d_with_indices_backward(xla ? gd : g, xla ? xd : x, {2, 2}, {2, 2}, {0, 0}, {1, 1}, false,
                                                  xla ? idxd : idx);
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
      sync(model->conv1->weight);
    });
    std::printf("CNN graphs, %-5s: forward %.3f ms, forward+backward %.3f ms, optimizer %.3f ms",
                xla ? "xla" : "eager", fwd, fwbw, opt);
    if (xla) {
      // The optimizer's host side alone: tracing Adam's in-place ops without running them.
      const double trace = median_ms(warmup, reps, [&] {
        adam.step();
      });
      sync(model->conv1->weight);
      std::printf(" (tracing alone %.3f ms)", trace);
    }
    std::printf("\n");
  }
  return 0;
}
