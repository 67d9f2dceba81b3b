// SPDX-License-Identifier: Apache-2.0
// Per-op tests of the convolution rules (rules/conv.cpp): plain, transposed, host kernels, shifted sums.
// Tolerances and method: xla_rules/graphs.h and xla_rules/lazy_ops.h.

#include "xla_rules/graphs.h"
#include "xla_rules/lazy_ops.h"

using namespace xla_rules;

// As the CNN's graphs write them; the second convolution_backward leaves grad_input out.
const char* const kConvolutionIr = R"IR(
graph(%x : Tensor, %w : Tensor, %b : Tensor, %g : Tensor):
  %stride : int[] = prim::Constant[value=[STRIDE]]()
  %padding : int[] = prim::Constant[value=[PADDING]]()
  %dilation : int[] = prim::Constant[value=[DILATION]]()
  %false : bool = prim::Constant[value=0]()
  %no_pad : int[] = prim::Constant[value=[0, 0]]()
  %groups : int = prim::Constant[value=1]()
  %bias_sizes : int[] = prim::Constant[value=[BIAS]]()
  %all : bool[] = prim::Constant[value=[1, 1, 1]]()
  %no_input : bool[] = prim::Constant[value=[0, 1, 1]]()
  %y : Tensor = aten::convolution(%x, %w, %b, %stride, %padding, %dilation, %false, %no_pad, %groups)
  %gx : Tensor, %gw : Tensor, %gb : Tensor = aten::convolution_backward(%g, %x, %w, %bias_sizes, %stride, %padding, %dilation, %false, %no_pad, %groups, %all)
  %gx2 : Tensor, %gw2 : Tensor, %gb2 : Tensor = aten::convolution_backward(%g, %x, %w, %bias_sizes, %stride, %padding, %dilation, %false, %no_pad, %groups, %no_input)
  return (%y, %gx, %gw, %gb, %gw2)
)IR";

// Runs `body(ir, inputs, label)` for each convolution case: kConvolutionIr with its window, and
// random input, kernel, bias and output gradient.
template <class Body>
void for_each_convolution(Body body) {
  struct Case {
    std::vector<int64_t> x, w;
    std::string stride, padding, dilation;
    std::vector<int64_t> y;
  };
  torch::manual_seed(14);
  for (const Case& c : {Case{{4, 1, 28, 28}, {16, 1, 5, 5}, "1, 1", "2, 2", "1, 1", {4, 16, 28, 28}},
                        Case{{2, 3, 9, 8}, {5, 3, 3, 2}, "2, 3", "1, 0", "1, 1", {2, 5, 5, 3}},
                        Case{{2, 2, 10, 10}, {3, 2, 3, 3}, "2, 2", "0, 1", "2, 1", {2, 3, 3, 5}}}) {
    std::string text = kConvolutionIr;
    for (const auto& [key, value] : {std::pair<std::string, std::string>{"STRIDE", c.stride}, {"PADDING", c.padding},
                                     {"DILATION", c.dilation}, {"BIAS", std::to_string(c.w[0])}})
      text = std::regex_replace(text, std::regex(key), value);
    const std::string label = "input " + c10::str(c.x) + " kernel " + c10::str(c.w) + " stride " + c.stride +
                              " padding " + c.padding + " dilation " + c.dilation;
    body(text, std::vector<torch::Tensor>{torch::randn(c.x), torch::randn(c.w) * 0.3, torch::randn({c.w[0]}),
                                          torch::randn(c.y)},
         label);
  }
}

TEST(StableHlo, ConvolutionAndItsBackward) {
  for_each_convolution([](const std::string& text, const std::vector<torch::Tensor>& inputs, const std::string& label) {
    // float32: grad_weight sums up to 4 * 28 * 28 products (sums of std 50 and more), grad_input
    // 400, in another order than libtorch: differences up to 1.5e-4 and 1.2e-5 were seen, so
    // 1e-4 relative + 5e-5 absolute here, and the formulas are checked exactly in float64.
    check(text, {inputs[0], inputs[1], inputs[2], inputs[3]}, label, {1e-4, 5e-5});
    check(text, {inputs[0].to(torch::kDouble), inputs[1].to(torch::kDouble), inputs[2].to(torch::kDouble),
                 inputs[3].to(torch::kDouble)},
          label + ", float64", {1e-12, 1e-12});
  });
}

namespace {
// Registers the host kernels with the process's plugin, once for every test that runs in it.
void register_host_kernels() {
  static const bool registered = [] {
    fulgur::xla::host_kernels::register_with(pjrt::process_client().plugin());
    return true;
  }();
  (void)registered;
}
}  // namespace

// With EmitOptions::host_convolutions every convolution and convolution gradient is a custom call
// of libtorch's own kernel (xla/host_kernels.h), which XLA runs in the compiled program: the
// results are eager libtorch's to the bit, in float32 and float64, partial masks included.
TEST(StableHlo, ConvolutionsOnHostKernelsAreLibtorchsOwn) {
  register_host_kernels();
  fulgur::xla::stablehlo::EmitOptions host;
  host.host_convolutions = true;
  {
    const auto graph = parse(std::regex_replace(
        std::regex_replace(std::regex_replace(std::regex_replace(kConvolutionIr, std::regex("STRIDE"), "1, 1"),
                                              std::regex("PADDING"), "0, 0"),
                           std::regex("DILATION"), "1, 1"),
        std::regex("BIAS"), "3"));
    run_eager_and_type(*graph, {torch::randn({1, 2, 5, 5}), torch::randn({3, 2, 3, 3}), torch::randn({3}),
                                torch::randn({1, 3, 3, 3})});
    const std::string module = emit_stablehlo(*graph, host).module;
    EXPECT_EQ(module.find("stablehlo.convolution"), std::string::npos) << module;
    EXPECT_NE(module.find("call_target_name = \"fulgur_convolution_backward\""), std::string::npos) << module;
    EXPECT_NE(module.find("output_mask = array<i64: 0, 1, 1>"), std::string::npos) << module;
  }
  for_each_convolution([&](const std::string& text, const std::vector<torch::Tensor>& inputs, const std::string& label) {
    check(text, {inputs[0], inputs[1], inputs[2], inputs[3]}, label, {0, 0}, host);
    check(text, {inputs[0].to(torch::kDouble), inputs[1].to(torch::kDouble), inputs[2].to(torch::kDouble),
                 inputs[3].to(torch::kDouble)},
          label + ", float64", {0, 0}, host);
  });
}

// A host kernel that cannot run fails the execution with its own message, naming the target and
// the cause, and the process goes on.
TEST(StableHlo, AHostKernelsErrorFailsTheExecutionWithItsMessage) {
  register_host_kernels();
  const pjrt::Client& client = pjrt::process_client();
  const pjrt::Executable exe = client.compile(
      "func.func @main(%x: tensor<1x1x3x3xf32>, %w: tensor<1x1x2x2xf32>) -> tensor<1x1x2x2xf32> {\n"
      "  %0 = \"stablehlo.custom_call\"(%x, %w) {call_target_name = \"fulgur_convolution\", api_version = 4 : i32, "
      "backend_config = {groups = 1 : i64}} : (tensor<1x1x3x3xf32>, tensor<1x1x2x2xf32>) -> tensor<1x1x2x2xf32>\n"
      "  return %0 : tensor<1x1x2x2xf32>\n}\n");
  const pjrt::Buffer x = pjrt::to_device(client, torch::ones({1, 1, 3, 3})),
                     w = pjrt::to_device(client, torch::ones({1, 1, 2, 2}));
  try {
    std::vector<pjrt::Buffer> out = exe.execute({&x, &w});
    pjrt::to_tensor(out.at(0));
    FAIL() << "no error";
  } catch (const pjrt::PjrtError& e) {
    EXPECT_NE(std::string(e.what()).find("fulgur_convolution: attribute stride is missing (the call has: groups)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(torch::equal(pjrt::to_tensor(pjrt::to_device(client, torch::ones({2}))), torch::ones({2})));
}

// With EmitOptions::xla_cpu (platform rule shifted_sum_convolution), a convolution of one input
// feature with at most 25 kernel taps (float32/float64, groups 1) is written as a sum of shifted
// windows times the taps, not as a stablehlo.convolution (XLA:CPU's Eigen convolution is slow
// there, bench/RESULTS.md); others stay one stablehlo.convolution, as every one does without it.
// float32 within 1e-5 relative + 1e-5 absolute (sums of up to 25 products of values of std
// about 1, added in tap order, where oneDNN may fuse multiply-adds: 2e-6 seen), float64 1e-12.
TEST(StableHlo, ConvolutionOfOneInputFeatureIsASumOfShiftedWindows) {
  const std::string ir = R"IR(
graph(%x : Tensor, %w : Tensor, %b : Tensor):
  %stride : int[] = prim::Constant[value=[STRIDE]]()
  %padding : int[] = prim::Constant[value=[PADDING]]()
  %dilation : int[] = prim::Constant[value=[DILATION]]()
  %false : bool = prim::Constant[value=0]()
  %no_pad : int[] = prim::Constant[value=[NOPAD]]()
  %groups : int = prim::Constant[value=1]()
  %y : Tensor = aten::convolution(%x, %w, %b, %stride, %padding, %dilation, %false, %no_pad, %groups)
  %r : Tensor = aten::relu(%y)
  return (%r, %y)
)IR";
  struct Case {
    std::vector<int64_t> x, w;
    std::string stride, padding, dilation;
    bool shifted_sum;
  };
  torch::manual_seed(16);
  fulgur::xla::stablehlo::EmitOptions xla_cpu;  // a platform rule of the CPU plugin
  xla_cpu.xla_cpu = true;
  for (const Case& c : {// the MNIST CNN's conv1, its batch of 64
                        Case{{64, 1, 28, 28}, {16, 1, 5, 5}, "1, 1", "2, 2", "1, 1", true},
                        Case{{3, 1, 11, 9}, {4, 1, 3, 2}, "2, 3", "1, 0", "2, 1", true},
                        Case{{2, 1, 7, 8}, {3, 1, 1, 1}, "1, 1", "0, 0", "1, 1", true},
                        // one spatial dim: 5 taps
                        Case{{2, 1, 20}, {6, 1, 5}, "2", "3", "2", true},
                        // 36 taps, and 2 input features: a stablehlo.convolution
                        Case{{2, 1, 12, 12}, {4, 1, 6, 6}, "1, 1", "2, 2", "1, 1", false},
                        Case{{2, 2, 12, 12}, {4, 2, 5, 5}, "1, 1", "2, 2", "1, 1", false}}) {
    std::string text = ir;
    const std::string output_padding = c.x.size() == 3 ? "0" : "0, 0";
    for (const auto& [key, value] : {std::pair<std::string, std::string>{"STRIDE", c.stride}, {"PADDING", c.padding},
                                     {"DILATION", c.dilation}, {"NOPAD", output_padding}})
      text = std::regex_replace(text, std::regex(key), value);
    const std::string label = "input " + c10::str(c.x) + " kernel " + c10::str(c.w) + " stride " + c.stride +
                              " padding " + c.padding + " dilation " + c.dilation;
    SCOPED_TRACE(label);
    const std::vector<torch::Tensor> inputs = {torch::randn(c.x), torch::randn(c.w), torch::randn({c.w[0]})};
    check(text, {inputs[0], inputs[1], inputs[2]}, label, {1e-5, 1e-5}, xla_cpu);
    check(text, {inputs[0].to(torch::kDouble), inputs[1].to(torch::kDouble), inputs[2].to(torch::kDouble)},
          label + ", float64", {1e-12, 1e-12}, xla_cpu);
    const auto graph = parse(text);
    run_eager_and_type(*graph, {inputs[0], inputs[1], inputs[2]});
    const std::string module = emit_stablehlo(*graph, xla_cpu).module;
    EXPECT_EQ(module.find("stablehlo.convolution") == std::string::npos, c.shifted_sum) << module;
    // The generic rule: one stablehlo.convolution.
    EXPECT_NE(emit_stablehlo(*graph).module.find("stablehlo.convolution"), std::string::npos);
  }
}

// Transposed convolutions (nn::ConvTranspose1d/2d: aten::convolution with transposed true) and
// their backwards on the lazy device: stride 1 and 2, padding, output_padding, dilation, with and
// without bias, 1-d and 2-d, float32, float64 and bfloat16; groups forward only (the backward of
// a grouped convolution is not lowered). A small decoder of ConvTranspose2d trains on xla as on
// the CPU with nothing left on the host.
TEST(XlaOps, TransposedConvolutionAndItsBackward) {
  torch::manual_seed(21);
  namespace F = torch::nn::functional;
  const Tolerance tol{1e-4, 5e-5};
  Options o;
  o.tol = tol;
  auto transposed = [](F::ConvTranspose2dFuncOptions opts) {
    return [opts](const auto& v) {
      return F::conv_transpose2d(v[0], v[1], F::ConvTranspose2dFuncOptions(opts).bias(v.size() > 2 ? v[2] : torch::Tensor()));
    };
  };
  check_op("stride 1", transposed({}), {torch::randn({2, 3, 5, 5}), torch::randn({3, 4, 3, 3}), torch::randn({4})}, o);
  const auto strided = F::ConvTranspose2dFuncOptions().stride(2).padding(1).output_padding(1);
  check_op("stride 2 padding 1 output_padding 1", transposed(strided),
           {torch::randn({1, 2, 4, 6}), torch::randn({2, 3, 3, 3}), torch::randn({3})}, o);
  check_op("output_padding above padding", transposed(F::ConvTranspose2dFuncOptions().stride(3).output_padding(2)),
           {torch::randn({2, 2, 3, 3}), torch::randn({2, 2, 2, 2})}, o);
  check_op("dilation 2, no bias", transposed(F::ConvTranspose2dFuncOptions().stride({2, 1}).dilation(2)),
           {torch::randn({2, 2, 3, 4}), torch::randn({2, 2, 2, 3})}, o);
  check_op("1-d", [](const auto& v) {
    return F::conv_transpose1d(v[0], v[1], F::ConvTranspose1dFuncOptions().bias(v[2]).stride(3).padding(2));
  }, {torch::randn({2, 3, 7}), torch::randn({3, 2, 4}), torch::randn({2})}, o);
  check_op("float64", transposed(strided),
           {torch::randn({1, 2, 4, 6}, torch::kDouble), torch::randn({2, 3, 3, 3}, torch::kDouble),
            torch::randn({3}, torch::kDouble)},
           Options{{1e-12, 1e-12}});
  check_op("bf16", transposed(strided),
           {torch::randn({1, 2, 4, 6}).to(torch::kBFloat16), torch::randn({2, 3, 3, 3}).to(torch::kBFloat16)},
           Options{{2e-2, 5e-2}});
  Options forward = o;
  forward.backward = false;
  check_op("groups 2", transposed(F::ConvTranspose2dFuncOptions().groups(2).stride(2)),
           {torch::randn({1, 4, 3, 3}), torch::randn({4, 3, 2, 2}), torch::randn({6})}, forward);

  const auto eager = check_training("a ConvTranspose2d decoder", [] {
    namespace nn = torch::nn;
    return nn::Sequential(nn::ConvTranspose2d(nn::ConvTranspose2dOptions(3, 4, 3).stride(2).padding(1).output_padding(1)),
                          nn::Tanh(), nn::ConvTranspose2d(nn::ConvTranspose2dOptions(4, 1, 2)))
        .ptr();
  }, [](torch::nn::Module& m, const torch::Tensor& x) {
    return static_cast<torch::nn::SequentialImpl&>(m).forward(x).square().mean();
  }, torch::randn({4, 3, 4, 4}));
  EXPECT_TRUE(eager.empty()) << xla::metrics_report();
}
