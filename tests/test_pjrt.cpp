// SPDX-License-Identifier: Apache-2.0
// The PJRT runtime (src/xla/pjrt) against the real XLA CPU plugin that scripts/install-deps
// installs, and the loader's errors on files that are not usable plugins.

#include <fulgur/accelerators/accelerator.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <dlfcn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>

#include "runtime/threads.h"
#include "support.h"
#include "xla/pjrt/client.h"
#include "xla/pjrt/metrics.h"
#include "xla/pjrt/plugin.h"
#include "xla/pjrt/plugin_choice.h"
#include "xla/pjrt/tensors.h"

namespace pjrt = fulgur::xla::pjrt;
using fulgur::testing::TempDir;

namespace {

const char* const kMulAdd = R"(
func.func @main(%a: tensor<4x5xf32>, %b: tensor<4x5xf32>, %c: tensor<4x5xf32>) -> tensor<4x5xf32> {
  %0 = stablehlo.multiply %a, %b : tensor<4x5xf32>
  %1 = stablehlo.add %0, %c : tensor<4x5xf32>
  return %1 : tensor<4x5xf32>
}
)";

// A batched matmul and a linear layer's x @ w^T, as two outputs of one program.
const char* const kDots = R"(
func.func @main(%x: tensor<2x3x4xf32>, %y: tensor<2x4x5xf32>, %v: tensor<3x4xf32>, %w: tensor<5x4xf32>)
    -> (tensor<2x3x5xf32>, tensor<3x5xf32>) {
  %0 = stablehlo.dot_general %x, %y, batching_dims = [0] x [0], contracting_dims = [2] x [1]
      : (tensor<2x3x4xf32>, tensor<2x4x5xf32>) -> tensor<2x3x5xf32>
  %1 = stablehlo.dot_general %v, %w, contracting_dims = [1] x [1] : (tensor<3x4xf32>, tensor<5x4xf32>) -> tensor<3x5xf32>
  return %0, %1 : tensor<2x3x5xf32>, tensor<3x5xf32>
}
)";

const char* const kAddI64 = R"(
func.func @main(%a: tensor<3xi64>, %b: tensor<3xi64>) -> tensor<3xi64> {
  %0 = stablehlo.add %a, %b : tensor<3xi64>
  return %0 : tensor<3xi64>
}
)";

// One client for the tests of this process (each CTest test is a process of its own).
class Pjrt : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const auto start = std::chrono::steady_clock::now();
    const pjrt::Plugin& plugin = pjrt::Plugin::load(pjrt::choose_plugin().path);
    const auto loaded = std::chrono::steady_clock::now();
    client_ = new pjrt::Client(plugin, pjrt::ClientOptions{});
    const auto created = std::chrono::steady_clock::now();
    std::printf("PJRT plugin %s: API %d.%d, loaded in %.0f ms, client started in %.0f ms\n", plugin.path().c_str(),
                plugin.major_version(), plugin.minor_version(),
                std::chrono::duration<double, std::milli>(loaded - start).count(),
                std::chrono::duration<double, std::milli>(created - loaded).count());
  }
  static void TearDownTestSuite() {
    delete client_;
    client_ = nullptr;
  }
  static pjrt::Client& client() { return *client_; }

  static pjrt::Client* client_;
};
pjrt::Client* Pjrt::client_ = nullptr;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_F(Pjrt, PinnedCpuPluginIsLoadedWithItsVersionAndAttributes) {
  const pjrt::Plugin& plugin = client().plugin();
  EXPECT_EQ(plugin.path(), pjrt::PluginLocations::built_in().cpu_plugin);
  EXPECT_EQ(plugin.major_version(), 0);
  EXPECT_GE(plugin.minor_version(), 81);
  ASSERT_EQ(plugin.attributes().count("stablehlo_current_version"), 1u);
  EXPECT_NE(plugin.attributes().at("stablehlo_current_version"), "");
  EXPECT_EQ(client().platform_name(), "cpu");
  EXPECT_EQ(client().addressable_devices(), 1u);  // cpu_device_count = 1
  // Loading the same file again gives the same plugin.
  EXPECT_EQ(&pjrt::Plugin::load(plugin.path()), &plugin);
}

TEST_F(Pjrt, MultiplyAddMatchesEager) {
  torch::manual_seed(0);
  const auto a = torch::randn({4, 5}), b = torch::randn({4, 5}), c = torch::randn({4, 5});
  const pjrt::Executable exe = client().compile(kMulAdd);
  ASSERT_EQ(exe.num_outputs(), 1u);
  const pjrt::Buffer da = pjrt::to_device(client(), a), db = pjrt::to_device(client(), b),
                     dc = pjrt::to_device(client(), c);
  std::vector<pjrt::Buffer> out = exe.execute({&da, &db, &dc});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].dims(), (std::vector<int64_t>{4, 5}));
  EXPECT_EQ(out[0].element_type(), pjrt::ElementType::f32);
  const torch::Tensor got = pjrt::to_tensor(out[0]);
  // XLA may fuse the multiply and the add into one rounding (FMA): 1e-6 covers that.
  EXPECT_TRUE(torch::allclose(got, a * b + c, 1e-6, 1e-6)) << got << "\n" << a * b + c;
  // The same executable runs again on other inputs.
  const pjrt::Buffer ones = pjrt::to_device(client(), torch::ones({4, 5}));
  out = exe.execute({&ones, &ones, &ones});
  EXPECT_TRUE(torch::equal(pjrt::to_tensor(out[0]), torch::full({4, 5}, 2.0f)));
}

// A program whose result may take over its first argument's buffer (as the emitter aliases an
// optimizer's state to its update): a donated argument gives its memory to the result and is
// deleted; one that is not donated is copied first and keeps its value.
TEST_F(Pjrt, ADonatedArgumentIsTakenOverAndAKeptOneKeepsItsValue) {
  const char* const kAxpyInPlace = R"(
func.func @main(%m: tensor<64x32xf32> {tf.aliasing_output = 0 : i32}, %g: tensor<64x32xf32>) -> tensor<64x32xf32> {
  %c = stablehlo.constant dense<0.9> : tensor<64x32xf32>
  %0 = stablehlo.multiply %m, %c : tensor<64x32xf32>
  %1 = stablehlo.add %0, %g : tensor<64x32xf32>
  return %1 : tensor<64x32xf32>
}
)";
  torch::manual_seed(0);
  const auto m = torch::randn({64, 32}), g = torch::randn({64, 32});
  const pjrt::Executable exe = client().compile(kAxpyInPlace);
  const pjrt::Buffer dg = pjrt::to_device(client(), g);
  const torch::Tensor want = m * 0.9 + g;

  // Not donated: the plugin copies the argument, which keeps its value.
  const pjrt::Buffer kept = pjrt::to_device(client(), m);
  std::vector<pjrt::Buffer> out = exe.execute({&kept, &dg});
  EXPECT_TRUE(torch::allclose(pjrt::to_tensor(out[0]), want, 1e-6, 1e-6));
  EXPECT_FALSE(kept.is_deleted());
  EXPECT_TRUE(torch::equal(pjrt::to_tensor(kept), m));

  // Donated, in a loop as a training step does: each result takes the last one's memory.
  auto state = std::make_shared<const pjrt::Buffer>(pjrt::to_device(client(), m));
  torch::Tensor expected = m;
  for (int step = 0; step < 50; ++step) {
    const auto given = state;
    std::vector<pjrt::Buffer> next = exe.execute({given.get(), &dg}, {given});
    EXPECT_TRUE(given->is_deleted()) << "step " << step;
    state = std::make_shared<const pjrt::Buffer>(std::move(next[0]));
    expected = expected * 0.9 + g;
  }
  EXPECT_TRUE(torch::allclose(pjrt::to_tensor(*state), expected, 1e-5, 1e-5));

  // A donated buffer must be one of the arguments.
  const auto stranger = std::make_shared<const pjrt::Buffer>(pjrt::to_device(client(), m));
  EXPECT_THROW(exe.execute({&kept, &dg}, {stranger}), std::invalid_argument);
  EXPECT_FALSE(stranger->is_deleted());
}

TEST_F(Pjrt, DotGeneralMatchesEagerMatmuls) {
  torch::manual_seed(1);
  const auto x = torch::randn({2, 3, 4}), y = torch::randn({2, 4, 5}), v = torch::randn({3, 4}),
             w = torch::randn({5, 4});
  const double compile_before = pjrt::runtime_metrics().compile_seconds;
  const pjrt::Executable exe = client().compile(kDots);
  std::printf("compile of the dot_general program: %.0f ms\n",
              (pjrt::runtime_metrics().compile_seconds - compile_before) * 1e3);
  ASSERT_EQ(exe.num_outputs(), 2u);
  const pjrt::Buffer dx = pjrt::to_device(client(), x), dy = pjrt::to_device(client(), y),
                     dv = pjrt::to_device(client(), v), dw = pjrt::to_device(client(), w);
  const std::vector<pjrt::Buffer> out = exe.execute({&dx, &dy, &dv, &dw});
  ASSERT_EQ(out.size(), 2u);
  // Sums of 4 products in another order than libtorch's: 1e-5.
  EXPECT_TRUE(torch::allclose(pjrt::to_tensor(out[0]), torch::bmm(x, y), 1e-5, 1e-5));
  EXPECT_TRUE(torch::allclose(pjrt::to_tensor(out[1]), torch::matmul(v, w.t()), 1e-5, 1e-5));
}

TEST_F(Pjrt, IntegerProgramAndNonContiguousUpload) {
  const int64_t big = int64_t{1} << 40;  // needs 64 bits
  const auto a = torch::tensor({int64_t{1}, int64_t{-2}, int64_t{3}}), b = torch::tensor({int64_t{10}, int64_t{20}, big});
  const pjrt::Executable exe = client().compile(kAddI64);
  const pjrt::Buffer da = pjrt::to_device(client(), a), db = pjrt::to_device(client(), b);
  const auto out = exe.execute({&da, &db});
  EXPECT_TRUE(torch::equal(pjrt::to_tensor(out[0]), torch::tensor({int64_t{11}, int64_t{18}, big + 3})));

  // A transposed view goes up in its logical (row-major) order; other dtypes keep their bits.
  const auto m = torch::arange(6, torch::kFloat).reshape({2, 3}).t();
  EXPECT_TRUE(torch::equal(pjrt::to_tensor(pjrt::to_device(client(), m)), m.contiguous()));
  for (const auto& t : {torch::tensor({true, false, true}), torch::tensor({1.5, -2.25}, torch::kDouble),
                        torch::tensor({1.5f, -3.0f}).to(torch::kBFloat16)}) {
    const torch::Tensor back = pjrt::to_tensor(pjrt::to_device(client(), t));
    EXPECT_EQ(back.scalar_type(), t.scalar_type());
    EXPECT_TRUE(torch::equal(back, t)) << t;
  }
}

TEST_F(Pjrt, MetricsCountCompilesExecutionsAndBytes) {
  const pjrt::RuntimeMetrics before = pjrt::runtime_metrics();
  const pjrt::Executable exe = client().compile(kMulAdd);
  const pjrt::Buffer a = pjrt::to_device(client(), torch::ones({4, 5}));
  const auto out = exe.execute({&a, &a, &a});
  pjrt::to_tensor(out[0]);
  const pjrt::RuntimeMetrics after = pjrt::runtime_metrics();
  EXPECT_EQ(after.programs_compiled - before.programs_compiled, 1);
  EXPECT_GT(after.compile_seconds, before.compile_seconds);
  EXPECT_EQ(after.executions - before.executions, 1);
  EXPECT_EQ(after.bytes_to_device - before.bytes_to_device, 4 * 5 * 4);
  EXPECT_EQ(after.bytes_to_host - before.bytes_to_host, 4 * 5 * 4);
  std::printf("compile of the a*b+c program: %.0f ms\n", (after.compile_seconds - before.compile_seconds) * 1e3);
}

TEST_F(Pjrt, ProgramThePluginRejectsIsAnErrorWithItsDiagnostics) {
  try {
    client().compile("func.func @main(%a: tensor<2xf32>) -> tensor<2xf32> {\n  %0 = stablehlo.bogus %a\n}\n");
    FAIL() << "compiled a program with an unknown op";
  } catch (const pjrt::PjrtError& e) {
    EXPECT_EQ(e.call(), "PJRT_Client_Compile");
    EXPECT_EQ(e.plugin(), client().plugin().path());
    EXPECT_NE(e.cause().find("stablehlo.bogus"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(client().plugin().path()), std::string::npos) << e.what();
  }
  // Well-formed text whose types do not match: rejected by the verifier.
  const std::string mismatch = error_of([&] {
    client().compile(
        "func.func @main(%a: tensor<2xf32>, %b: tensor<3xf32>) -> tensor<2xf32> {\n"
        "  %0 = stablehlo.add %a, %b : (tensor<2xf32>, tensor<3xf32>) -> tensor<2xf32>\n"
        "  return %0 : tensor<2xf32>\n}\n");
  });
  EXPECT_NE(mismatch.find("PJRT_Client_Compile failed"), std::string::npos) << mismatch;
  // The client still works afterwards.
  EXPECT_EQ(client().compile(kAddI64).num_outputs(), 1u);
}

TEST_F(Pjrt, WrongArgumentsAreErrorsNotAborts) {
  const pjrt::Executable exe = client().compile(kMulAdd);
  const pjrt::Buffer a = pjrt::to_device(client(), torch::ones({4, 5}));
  const std::string too_few = error_of([&] { exe.execute({&a}); });
  EXPECT_NE(too_few.find("PJRT_LoadedExecutable_Execute failed"), std::string::npos) << too_few;
  const auto out = exe.execute({&a, &a, &a});
  float small[3];
  const std::string size = error_of([&] { out[0].to_host(small, sizeof small); });
  EXPECT_NE(size.find("80 bytes"), std::string::npos) << size;
}

TEST(PjrtPlugin, MissingFileIsAnErrorNamingIt) {
  const std::string what = error_of([] { pjrt::Plugin::load("/nonexistent/xla_plugin.so"); });
  EXPECT_NE(what.find("/nonexistent/xla_plugin.so"), std::string::npos) << what;
  EXPECT_NE(what.find("no such file"), std::string::npos) << what;
}

TEST(PjrtPlugin, ExecutableAndTextFileAreNotPlugins) {
  const std::string ls = error_of([] { pjrt::Plugin::load("/bin/ls"); });
  EXPECT_NE(ls.find("dlopen failed for PJRT plugin /bin/ls"), std::string::npos) << ls;
  TempDir dir;
  const std::string text = dir.path + "/plugin.so";
  std::ofstream(text) << std::string(40, '#') << "\nnot a shared library, but long enough to have an ELF header\n";
  const std::string t = error_of([&] { pjrt::Plugin::load(text); });
  EXPECT_NE(t.find("dlopen failed for PJRT plugin " + text), std::string::npos) << t;
  EXPECT_NE(t.find("invalid ELF header"), std::string::npos) << t;
}

TEST(PjrtPlugin, SharedLibraryWithoutGetPjrtApiIsNotAPlugin) {
  Dl_info info{};
  ASSERT_NE(dladdr(reinterpret_cast<void*>(static_cast<double (*)(double)>(&::cos)), &info), 0);
  const std::string libm = info.dli_fname;  // the C math library, loaded in this process
  const std::string what = error_of([&] { pjrt::Plugin::load(libm); });
  EXPECT_NE(what.find("dlsym(GetPjrtApi) failed for PJRT plugin " + libm), std::string::npos) << what;
  EXPECT_NE(what.find("not a PJRT plugin"), std::string::npos) << what;
}

TEST(PjrtPlugin, OtherMajorVersionIsRefused) {
  const std::string fake = fulgur::testing::program("fake_pjrt_major1.so");
  const std::string what = error_of([&] { pjrt::Plugin::load(fake); });
  EXPECT_NE(what.find("GetPjrtApi failed for PJRT plugin " + fake), std::string::npos) << what;
  EXPECT_NE(what.find("PJRT C API 1.0"), std::string::npos) << what;
  EXPECT_NE(what.find("major versions must be equal"), std::string::npos) << what;
}

TEST(PjrtPlugin, FunctionTableTooShortIsRefused) {
  const std::string fake = fulgur::testing::program("fake_pjrt_old.so");
  const std::string what = error_of([&] { pjrt::Plugin::load(fake); });
  EXPECT_NE(what.find(fake), std::string::npos) << what;
  EXPECT_NE(what.find("function table"), std::string::npos) << what;
  EXPECT_NE(what.find("0.1 is too old"), std::string::npos) << what;
}

TEST(PjrtPluginChoice, DefaultIsThePinnedCpuPlugin) {
  const pjrt::PluginLocations where = pjrt::PluginLocations::built_in();
  const pjrt::PluginChoice c = pjrt::choose_plugin({}, where);
  EXPECT_EQ(c.device, "CPU");
  EXPECT_EQ(c.path, where.cpu_plugin);
  EXPECT_NE(c.path.find("xla_cpu_pjrt.so"), std::string::npos);
  EXPECT_EQ(pjrt::choose_plugin({"CPU", "", ""}, where).path, where.cpu_plugin);
}

TEST(PjrtPluginChoice, LibraryPathWins) {
  const pjrt::PluginLocations where = pjrt::PluginLocations::built_in();
  EXPECT_EQ(pjrt::choose_plugin({"", "/opt/my_plugin.so", ""}, where).path, "/opt/my_plugin.so");
  EXPECT_EQ(pjrt::choose_plugin({"", "/opt/my_plugin.so", ""}, where).device, "");
  EXPECT_EQ(pjrt::choose_plugin({"TPU", "/opt/my_plugin.so", ""}, where).path, "/opt/my_plugin.so");
}

TEST(PjrtPluginChoice, UnknownDeviceNamesTheValueAndTheAllowedOnes) {
  const std::string what = error_of([] { pjrt::choose_plugin({"GPU", "", ""}, pjrt::PluginLocations::built_in()); });
  for (const char* part : {"PJRT_DEVICE=GPU", "CPU", "TPU", "CUDA", "PJRT_LIBRARY_PATH"})
    EXPECT_NE(what.find(part), std::string::npos) << part << " not in: " << what;
}

TEST(PjrtPluginChoice, TpuAndCudaPluginsAreFoundOrExplained) {
  const pjrt::PluginLocations nowhere{"/nowhere/cpu.so", "/nowhere/venv", "/nowhere/venv/lib/python3/site-packages"};
  const std::string tpu = error_of([&] { pjrt::choose_plugin({"TPU", "", ""}, nowhere); });
  for (const char* part : {"PJRT_DEVICE=TPU", "/nowhere/venv/lib/python3/site-packages/libtpu/libtpu.so",
                           "/nowhere/venv/bin/pip install libtpu", "TPU_LIBRARY_PATH"})
    EXPECT_NE(tpu.find(part), std::string::npos) << part << " not in: " << tpu;
  EXPECT_EQ(pjrt::choose_plugin({"TPU", "", "/opt/libtpu.so"}, nowhere).path, "/opt/libtpu.so");
  const std::string cuda = error_of([&] { pjrt::choose_plugin({"CUDA", "", ""}, nowhere); });
  for (const char* part : {"jax-cuda13-pjrt", "jax-cuda12-pjrt", "/nowhere/venv/lib/python3/site-packages/jax_plugins/xla_cuda13/",
                           "PJRT_LIBRARY_PATH"})
    EXPECT_NE(cuda.find(part), std::string::npos) << part << " not in: " << cuda;
  const std::string cpu = error_of([&] { pjrt::choose_plugin({}, nowhere); });
  EXPECT_NE(cpu.find("scripts/install-deps"), std::string::npos) << cpu;

  // A site-packages folder where the pip packages put them.
  TempDir dir;
  std::filesystem::create_directories(dir.path + "/libtpu");
  std::ofstream(dir.path + "/libtpu/libtpu.so") << "";
  std::filesystem::create_directories(dir.path + "/jax_plugins/xla_cuda12");
  std::ofstream(dir.path + "/jax_plugins/xla_cuda12/xla_cuda_plugin.so") << "";
  const pjrt::PluginLocations site{"/nowhere/cpu.so", "/nowhere/venv", dir.path};
  EXPECT_EQ(pjrt::choose_plugin({"TPU", "", ""}, site).path, dir.path + "/libtpu/libtpu.so");
  EXPECT_EQ(pjrt::choose_plugin({"CUDA", "", ""}, site).path, dir.path + "/jax_plugins/xla_cuda12/xla_cuda_plugin.so");
  // The CUDA 13 package wins over the CUDA 12 one; a folder after fulgur's own is searched too.
  TempDir other;
  std::filesystem::create_directories(other.path + "/jax_plugins/xla_cuda13");
  std::ofstream(other.path + "/jax_plugins/xla_cuda13/xla_cuda_plugin.so") << "";
  const pjrt::PluginLocations system{"/nowhere/cpu.so", "/nowhere/venv", "/nowhere/site", "", {other.path}};
  EXPECT_EQ(pjrt::choose_plugin({"CUDA", "", ""}, system).path, other.path + "/jax_plugins/xla_cuda13/xla_cuda_plugin.so");
  std::filesystem::create_directories(dir.path + "/jax_plugins/xla_cuda13");
  std::ofstream(dir.path + "/jax_plugins/xla_cuda13/xla_cuda_plugin.so") << "";
  EXPECT_EQ(pjrt::choose_plugin({"CUDA", "", ""}, site).path, dir.path + "/jax_plugins/xla_cuda13/xla_cuda_plugin.so");
}

TEST(PjrtProcessClient, FollowsTheEnvironment) {
  setenv("PJRT_DEVICE", "GPU", 1);
  const std::string what = error_of([] { pjrt::process_client(); });
  EXPECT_NE(what.find("PJRT_DEVICE=GPU"), std::string::npos) << what;
  unsetenv("PJRT_DEVICE");
  setenv("PJRT_LIBRARY_PATH", "/nonexistent/other_plugin.so", 1);
  const std::string missing = error_of([] { pjrt::process_client(); });
  EXPECT_NE(missing.find("/nonexistent/other_plugin.so"), std::string::npos) << missing;
  unsetenv("PJRT_LIBRARY_PATH");
  // Issue 32, C10: a malformed LOCAL_WORLD_SIZE (the workers' thread count comes from it) is an
  // error naming it; it used to become 1 silently.
  setenv("LOCAL_WORLD_SIZE", "2x", 1);
  const std::string malformed = error_of([] { pjrt::process_client(); });
  EXPECT_NE(malformed.find("LOCAL_WORLD_SIZE='2x' must be a non-negative integer"), std::string::npos) << malformed;
  unsetenv("LOCAL_WORLD_SIZE");
  // A failed creation is not remembered: now the default plugin.
  pjrt::Client& client = pjrt::process_client();
  EXPECT_EQ(client.plugin().path(), pjrt::PluginLocations::built_in().cpu_plugin);
  EXPECT_EQ(&pjrt::process_client(), &client);
  const pjrt::Executable exe = client.compile(kAddI64);
  const pjrt::Buffer a = pjrt::to_device(client, torch::tensor({1, 2, 3}, torch::kLong));
  EXPECT_TRUE(torch::equal(pjrt::to_tensor(exe.execute({&a, &a})[0]), torch::tensor({2, 4, 6}, torch::kLong)));
}

// The pinned CPU plugin's client adds fulgur's XLA options to the user's XLA_FLAGS before XLA
// reads them: the user's dump flags still work, and the dump shows reductions as XNNPACK
// fusions. A flag the user names keeps the user's value. (Each CTest test is a process of its
// own, so this client is the process's first and XLA reads XLA_FLAGS here.)
TEST(PjrtXlaFlags, TheCpuPluginsClientAddsFulgursXlaOptionsToTheUsers) {
  TempDir dump;
  const std::string user = "--xla_dump_to=" + dump.path + " --xla_dump_hlo_as_text";
  setenv("XLA_FLAGS", user.c_str(), 1);
  const pjrt::Plugin& plugin = pjrt::Plugin::load(pjrt::PluginLocations::built_in().cpu_plugin);
  pjrt::Client client(plugin, pjrt::ClientOptions{});
  EXPECT_EQ(std::string(std::getenv("XLA_FLAGS")),
            user + " --xla_cpu_experimental_xnn_fusion_type=LIBRARY_FUSION_TYPE_REDUCE");
  const pjrt::Executable exe = client.compile(R"(
func.func @main(%a: tensor<64x256xf32>) -> tensor<256xf32> {
  %z = stablehlo.constant dense<0.0> : tensor<f32>
  %0 = stablehlo.reduce(%a init: %z) applies stablehlo.add across dimensions = [0] : (tensor<64x256xf32>, tensor<f32>) -> tensor<256xf32>
  return %0 : tensor<256xf32>
}
)");
  const auto a = torch::randn({64, 256});
  const pjrt::Buffer da = pjrt::to_device(client, a);
  EXPECT_TRUE(torch::allclose(pjrt::to_tensor(exe.execute({&da})[0]), a.sum(0), 1e-5, 1e-5));
  std::string optimized;
  for (const auto& f : std::filesystem::directory_iterator(dump.path)) {
    const std::string name = f.path().filename().string();
    if (name.find("after_optimizations.txt") == std::string::npos) continue;
    std::ifstream in(f.path());
    optimized.assign(std::istreambuf_iterator<char>(in), {});
  }
  ASSERT_FALSE(optimized.empty()) << "XLA wrote no dump: the user's XLA_FLAGS were lost";
  EXPECT_NE(optimized.find("xnn"), std::string::npos) << optimized;

  setenv("XLA_FLAGS", "--xla_cpu_experimental_xnn_fusion_type=LIBRARY_FUSION_TYPE_DOT", 1);
  { pjrt::Client again(plugin, pjrt::ClientOptions{}); }
  EXPECT_EQ(std::string(std::getenv("XLA_FLAGS")), "--xla_cpu_experimental_xnn_fusion_type=LIBRARY_FUSION_TYPE_DOT");
}

TEST(PjrtThreads, ClientSetsPjrtNprocFromTheThreadPolicyUnlessTheUserDid) {
  const pjrt::Plugin& plugin = pjrt::Plugin::load(pjrt::choose_plugin().path);
  unsetenv("PJRT_NPROC");
  pjrt::ClientOptions two_workers;
  two_workers.local_world_size = 2;
  { pjrt::Client client(plugin, two_workers); }
  ASSERT_NE(std::getenv("PJRT_NPROC"), nullptr);
  EXPECT_EQ(std::string(std::getenv("PJRT_NPROC")), std::to_string(fulgur::runtime::threads_per_worker(2)));

  setenv("PJRT_NPROC", "1", 1);
  { pjrt::Client client(plugin, pjrt::ClientOptions{}); }
  EXPECT_EQ(std::string(std::getenv("PJRT_NPROC")), "1");
}

// An installed fulgur records the copy of the CPU plugin in its package (fulgurConfig.cmake);
// that copy comes before the build's, PJRT_LIBRARY_PATH before both, and when neither exists the
// error names both places.
TEST(PjrtPluginChoice, AnInstalledPackagesPluginComesFirstAndAMissingOneNamesWhereItLooked) {
  TempDir dir;
  const std::string installed = dir.path + "/lib/fulgur/pjrt/xla_cpu_pjrt.so";
  std::filesystem::create_directories(dir.path + "/lib/fulgur/pjrt");
  std::ofstream(installed) << "";
  pjrt::PluginLocations where = pjrt::PluginLocations::built_in();
  EXPECT_EQ(where.installed_cpu_plugin, "") << "this test program did not find an installed package";
  where.installed_cpu_plugin = installed;
  EXPECT_EQ(pjrt::choose_plugin({}, where).path, installed);
  EXPECT_EQ(pjrt::choose_plugin({"", "/opt/my_plugin.so", ""}, where).path, "/opt/my_plugin.so");
  where.installed_cpu_plugin = dir.path + "/gone.so";
  EXPECT_EQ(pjrt::choose_plugin({}, where).path, pjrt::PluginLocations::built_in().cpu_plugin);
  where.cpu_plugin = "/nowhere/cpu.so";
  const std::string what = error_of([&] { pjrt::choose_plugin({}, where); });
  for (const std::string part : {dir.path + "/gone.so", std::string("/nowhere/cpu.so"), std::string("PJRT_LIBRARY_PATH")})
    EXPECT_NE(what.find(part), std::string::npos) << part << " not in: " << what;
}

// ------------------------------------------------- one device per rank (a fake 4-device plugin)

namespace {

std::string fake_devices_plugin() { return fulgur::testing::program("fake_pjrt_devices.so"); }

pjrt::ClientOptions rank_options(int64_t local_rank) {
  pjrt::ClientOptions o;
  o.cpu_device_count.reset();  // the fake plugin refuses options it does not know
  o.local_rank = local_rank;
  return o;
}

// In a forked child with `env` set: process_client()'s device id * 10 + its addressable devices
// as the exit code (99: it threw, the message on stderr), and the TPU variables it was given
// written to `tpu_out`, one NAME=value per line.
int process_client_in_child(const std::vector<std::pair<std::string, std::string>>& env, const std::string& tpu_out) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
    try {
      pjrt::Client& c = pjrt::process_client();
      std::ofstream out(tpu_out);
      for (const char* name : {"TPU_VISIBLE_CHIPS", "TPU_CHIPS_PER_PROCESS_BOUNDS", "TPU_PROCESS_BOUNDS",
                               "TPU_PROCESS_PORT", "TPU_PROCESS_ADDRESSES", "CLOUD_TPU_TASK_ID"})
        if (const char* v = std::getenv(name)) out << name << "=" << v << "\n";
      out.close();
      std::_Exit(static_cast<int>(c.device_id() * 10 + static_cast<int64_t>(c.addressable_devices())));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s\n", e.what());
      std::_Exit(99);
    }
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace

TEST(PjrtDevicePerRank, EachLocalRankTakesItsOwnDeviceOfAPluginThatShowsThemAll) {
  const pjrt::Plugin& plugin = pjrt::Plugin::load(fake_devices_plugin());
  for (int64_t k = 0; k < 4; ++k) {
    pjrt::Client client(plugin, rank_options(k));
    EXPECT_EQ(client.addressable_devices(), 4u);
    EXPECT_EQ(client.device_id(), k);
  }
  const std::string what = error_of([&] { pjrt::Client client(plugin, rank_options(4)); });
  for (const char* part : {"local rank 4", "shows 4", "start at most 4 processes"})
    EXPECT_NE(what.find(part), std::string::npos) << part << " not in: " << what;
}

TEST(PjrtDevicePerRank, VisibleDevicesLeaveTheClientTheDeviceOfItsRank) {
  const pjrt::Plugin& plugin = pjrt::Plugin::load(fake_devices_plugin());
  auto o = rank_options(2);
  o.visible_devices = std::vector<int64_t>{2};
  pjrt::Client client(plugin, o);
  EXPECT_EQ(client.addressable_devices(), 1u);
  EXPECT_EQ(client.device_id(), 2);
}

// What each rank's process gets from its environment: with PJRT_DEVICE=CUDA the plugin is told
// the one device the rank owns; with another plugin that shows every device the rank takes its
// own; with PJRT_DEVICE=TPU the rank's libtpu variables are set before the client exists.
TEST(PjrtDevicePerRank, EachRanksProcessGetsItsDeviceFromItsEnvironment) {
  TempDir dir;
  const std::string tpu = dir.path + "/tpu.txt";
  for (int k = 0; k < 2; ++k) {
    const std::vector<std::pair<std::string, std::string>> base{
        {"PJRT_LIBRARY_PATH", fake_devices_plugin()}, {"LOCAL_RANK", std::to_string(k)}, {"LOCAL_WORLD_SIZE", "2"}};
    auto cuda = base;
    cuda.emplace_back("PJRT_DEVICE", "CUDA");
    EXPECT_EQ(process_client_in_child(cuda, tpu), k * 10 + 1) << "CUDA, rank " << k;
    auto plain = base;
    plain.emplace_back("PJRT_DEVICE", "");
    EXPECT_EQ(process_client_in_child(plain, tpu), k * 10 + 4) << "a plugin showing all, rank " << k;
  }
  const std::vector<std::pair<std::string, std::string>> tpu_rank{{"PJRT_LIBRARY_PATH", fake_devices_plugin()},
                                                                  {"PJRT_DEVICE", "TPU"},
                                                                  {"LOCAL_RANK", "3"},
                                                                  {"LOCAL_WORLD_SIZE", "4"}};
  EXPECT_EQ(process_client_in_child(tpu_rank, tpu), 3 * 10 + 4);
  EXPECT_EQ(fulgur::testing::read_file(tpu),
            "TPU_VISIBLE_CHIPS=3\nTPU_CHIPS_PER_PROCESS_BOUNDS=1,1,1\nTPU_PROCESS_BOUNDS=2,2,1\nTPU_PROCESS_PORT=8479\n"
            "TPU_PROCESS_ADDRESSES=localhost:8476,localhost:8477,localhost:8478,localhost:8479\nCLOUD_TPU_TASK_ID=3\n");
  auto too_many = tpu_rank;
  too_many[2].second = "4";
  EXPECT_EQ(process_client_in_child(too_many, tpu), 99) << "rank 4 of a 4-device plugin";
}

TEST(PjrtDevicePerRank, TpuVariablesFollowTheHostsAndKeepTheUsers) {
  std::map<std::string, std::string> env{{"TPU_HOST_BOUNDS", "1,1,2"}, {"TPU_WORKER_ID", "1"},
                                         {"TPU_WORKER_HOSTNAMES", "10.0.0.1,10.0.0.2"}, {"TPU_PROCESS_PORT", "9000"}};
  auto lookup = [&](const char* n) -> const char* {
    const auto it = env.find(n);
    return it == env.end() ? nullptr : it->second.c_str();
  };
  std::map<std::string, std::string> got;
  for (const auto& [k, v] : pjrt::tpu_process_environment(1, 4, lookup)) got[k] = v;
  EXPECT_EQ(got.at("TPU_VISIBLE_CHIPS"), "1");
  EXPECT_EQ(got.at("TPU_PROCESS_BOUNDS"), "2,2,2");
  EXPECT_EQ(got.count("TPU_PROCESS_PORT"), 0u) << "the user's value is kept";
  EXPECT_EQ(got.at("CLOUD_TPU_TASK_ID"), "5");
  EXPECT_EQ(got.at("TPU_PROCESS_ADDRESSES"),
            "10.0.0.1:8476,10.0.0.1:8477,10.0.0.1:8478,10.0.0.1:8479,10.0.0.2:8476,10.0.0.2:8477,10.0.0.2:8478,"
            "10.0.0.2:8479");
  const auto none = [](const char*) -> const char* { return nullptr; };
  const std::string three = error_of([&] { pjrt::tpu_process_environment(0, 3, none); });
  EXPECT_NE(three.find("TPU_CHIPS_PER_HOST_BOUNDS"), std::string::npos) << three;
  env = {{"TPU_CHIPS_PER_HOST_BOUNDS", "2,x,1"}};
  const std::string bad = error_of([&] { pjrt::tpu_process_environment(0, 4, lookup); });
  EXPECT_NE(bad.find("TPU_CHIPS_PER_HOST_BOUNDS='2,x,1'"), std::string::npos) << bad;
}

// devices="auto" on xla with a plugin other than the CPU one: the plugin's addressable devices.
TEST(PjrtDevicePerRank, AutoDevicesOfAGpuOrTpuPluginAreItsAddressableDevices) {
  setenv("PJRT_LIBRARY_PATH", fake_devices_plugin().c_str(), 1);
  setenv("FAKE_PJRT_DEVICES", "3", 1);
  EXPECT_EQ(fulgur::XLAAccelerator().auto_device_count(), 3);
  EXPECT_EQ(fulgur::parse_devices("auto", fulgur::XLAAccelerator()).size(), 3u);
  setenv("PJRT_LIBRARY_PATH", "/nonexistent/plugin.so", 1);
  const std::string what = error_of([] { fulgur::XLAAccelerator().auto_device_count(); });
  EXPECT_NE(what.find("/nonexistent/plugin.so"), std::string::npos) << what;
  unsetenv("PJRT_LIBRARY_PATH");
  unsetenv("FAKE_PJRT_DEVICES");
}
