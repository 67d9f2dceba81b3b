// SPDX-License-Identifier: Apache-2.0
// The XLA compile cache (src/xla/pjrt/compile_cache.h): SHA-256 against the examples of FIPS
// 180-4, the entry format's checks, the folder's trust checks, and the cache behind
// Client::compile with the real CPU plugin. Each "run" is a forked child that starts its own
// PJRT client, as each stage's workers do; the parent never starts one.

#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include <fulgur/fulgur.h>
#include <fulgur/xla/backend.h>

#include <torch/torch.h>

#include "runtime/sha256.h"
#include "support.h"
#include "xla/pjrt/client.h"
#include "xla/pjrt/compile_cache.h"
#include "xla/pjrt/metrics.h"

namespace pjrt = fulgur::xla::pjrt;
namespace fs = std::filesystem;
using fulgur::testing::TempDir;

namespace {

std::string hex_sha256(const std::string& s) { return fulgur::runtime::to_hex(fulgur::runtime::sha256(s)); }

pjrt::CacheKey key_of(const std::string& text) { return fulgur::runtime::sha256(text); }

std::vector<fs::path> files_in(const std::string& dir) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path());
  return out;
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

// A program of the cache tests: x * y + c, with c a constant, so that two values of c are two
// programs.
std::string mul_add(int c) {
  return "func.func @main(%a: tensor<4xf32>, %b: tensor<4xf32>) -> tensor<4xf32> {\n"
         "  %c = stablehlo.constant dense<" + std::to_string(c) + ".0> : tensor<4xf32>\n"
         "  %0 = stablehlo.multiply %a, %b : tensor<4xf32>\n"
         "  %1 = stablehlo.add %0, %c : tensor<4xf32>\n"
         "  return %1 : tensor<4xf32>\n}\n";
}

// What one child run saw: its PJRT metrics, the program's result, and what it wrote to stderr.
struct ChildRun {
  int exit_code = -1;
  pjrt::RuntimeMetrics metrics;
  std::vector<float> result;
  std::string stderr_text;
};

// In a child: writes the process's PJRT metrics, then what `values` adds, as one line to
// `report`, and exits 0 without running destructors (the plugin's threads stay behind).
[[noreturn]] void report_and_exit(const std::string& report, const std::function<void(std::ostream&)>& values) {
  const pjrt::RuntimeMetrics m = pjrt::runtime_metrics();
  std::ofstream o(report);
  o << m.programs_compiled << " " << m.cache_hits << " " << m.cache_misses << " " << m.cache_rejected << " "
    << m.cache_bytes_read << " " << m.cache_bytes_written;
  values(o);
  o << "\n";
  o.close();
  std::fflush(stderr);
  std::_Exit(0);
}

// In a child: the error on its stderr, exit 99.
[[noreturn]] void fail_child(const std::exception& e) {
  std::fprintf(stderr, "%s\n", e.what());
  std::fflush(stderr);
  std::_Exit(99);
}

// Starts a child that sets `env` (FULGUR_XLA_CACHE_DIR among them; XLA_FLAGS is fulgur's
// default unless `env` sets it), compiles mul_add(c) (or `program`, when given) with
// process_client(), runs it on {1,2,3,4} * {5,6,7,8}, and reports. `go` (when given) is a pipe
// the child reads until the parent closes its write end, so that several children compile at
// once.
pid_t start_run(const std::string& report, int c, const std::vector<std::pair<std::string, std::string>>& env,
                const std::string& default_dir = "", const int* go = nullptr, const std::string& program = "") {
  const pid_t pid = ::fork();
  if (pid != 0) return pid;
  if (go) ::close(go[1]);
  const int err = ::open((report + ".stderr").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  ::dup2(err, 2);
  unsetenv("FULGUR_XLA_CACHE_DIR");
  unsetenv("XLA_FLAGS");
  for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
  if (!default_dir.empty()) pjrt::set_default_compile_cache_dir(default_dir);
  try {
    pjrt::Client& client = pjrt::process_client();
    if (go) {
      char b;
      while (::read(go[0], &b, 1) > 0) {
      }
    }
    pjrt::Executable exe = client.compile(program.empty() ? mul_add(c) : program);
    const float a[4] = {1, 2, 3, 4}, b[4] = {5, 6, 7, 8};
    pjrt::Buffer x = client.to_device(a, pjrt::ElementType::f32, {4});
    pjrt::Buffer y = client.to_device(b, pjrt::ElementType::f32, {4});
    float out[4];
    exe.execute({&x, &y})[0].to_host(out, sizeof out);
    report_and_exit(report, [&](std::ostream& o) {
      for (float v : out) o << " " << v;
    });
  } catch (const std::exception& e) {
    fail_child(e);
  }
}

ChildRun finish_run(pid_t pid, const std::string& report) {
  ChildRun r;
  int status = 0;
  ::waitpid(pid, &status, 0);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.stderr_text = fulgur::testing::read_file(report + ".stderr");
  std::istringstream in(fulgur::testing::read_file(report));
  in >> r.metrics.programs_compiled >> r.metrics.cache_hits >> r.metrics.cache_misses >> r.metrics.cache_rejected >>
      r.metrics.cache_bytes_read >> r.metrics.cache_bytes_written;
  // strtof reads both the decimal floats and the hexadecimal ones (exact parameters).
  for (std::string v; in >> v;) r.result.push_back(std::strtof(v.c_str(), nullptr));
  return r;
}

ChildRun run(const std::string& report, int c, const std::vector<std::pair<std::string, std::string>>& env,
             const std::string& default_dir = "", const int* go = nullptr, const std::string& program = "") {
  return finish_run(start_run(report, c, env, default_dir, go, program), report);
}

// The one entry file of `dir` (fails the test if there is not exactly one file).
std::string only_entry(const std::string& dir) {
  const auto files = files_in(dir);
  EXPECT_EQ(files.size(), 1u);
  return files.empty() ? "" : files[0].string();
}

// A convolution (run by libtorch's kernel through an XLA custom call on the CPU plugin) and a
// linear layer on regression_data's 8 features seen as a 2x4 image; Adam.
struct ConvNet : fulgur::LightningModule {
  ConvNet() : LightningModule("ConvNet") {
    conv = register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 2, 2)));
    fc = register_module("fc", torch::nn::Linear(6, 1));
  }
  fulgur::StepOutput training_step(const fulgur::Batch& b, int64_t) override {
    const auto h = torch::relu(conv->forward(b.data.view({-1, 1, 2, 4}))).flatten(1);
    const auto d = fc->forward(h) - b.target;
    return (d * d).mean();
  }
  fulgur::OptimizerConfig configure_optimizers() override {
    return std::make_shared<torch::optim::Adam>(parameters(), torch::optim::AdamOptions(1e-2));
  }
  torch::nn::Conv2d conv{nullptr};
  torch::nn::Linear fc{nullptr};
};

// In a child: fits ConvNet on xla for 10 steps with `root` as default_root_dir, XLA_FLAGS without
// XNNPACK fusions, and writes the
// PJRT metrics and the trained parameters' values (hexadecimal floats, exact) to `report`.
ChildRun fit_in_child(const std::string& root, const std::string& report) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int err = ::open((report + ".stderr").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ::dup2(err, 2);
    unsetenv("FULGUR_XLA_CACHE_DIR");
    setenv("FULGUR_XLA_BACKEND", "pjrt", 1);
    // No XNNPACK fusions (fulgur's default for reductions on the CPU plugin): the pinned plugin
    // cannot serialize them, so the step's programs would not be kept (see the next test).
    setenv("XLA_FLAGS", "--xla_cpu_experimental_xnn_fusion_type=", 1);
    try {
      torch::manual_seed(7);
      ConvNet net;
      fulgur::Trainer t(fulgur::TrainerOptions()
                            .accelerator("xla")
                            .devices(1)
                            .max_epochs(1)
                            .default_root_dir(root)
                            .logger(false)
                            .enable_progress_bar(false)
                            .enable_checkpointing(false)
                            .enable_model_summary(false)
                            .num_sanity_val_steps(0));
      t.fit(net, std::make_shared<fulgur::DataLoader>(fulgur::testing::regression_data(80),
                                                       fulgur::DataLoaderOptions(8)));
      report_and_exit(report, [&](std::ostream& o) {
        for (const auto& p : net.parameters()) {
          const at::Tensor t = p.detach().to(torch::kCPU).contiguous();
          for (int64_t i = 0; i < t.numel(); ++i) o << " " << std::hexfloat << t.data_ptr<float>()[i];
        }
      });
    } catch (const std::exception& e) {
      fail_child(e);
    }
  }
  return finish_run(pid, report);
}

const std::vector<float> kExpected = {5 + 3, 12 + 3, 21 + 3, 32 + 3};  // mul_add(3)

}  // namespace

TEST(Sha256, MatchesTheStandardsExamples) {
  EXPECT_EQ(hex_sha256(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(hex_sha256("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(hex_sha256("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(hex_sha256(std::string(1000000, 'a')), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  // Fed in uneven pieces, the digest is the same.
  const std::string text(1000, 'x');
  fulgur::runtime::Sha256 h;
  for (size_t at = 0, n = 1; at < text.size(); at += n, n = n * 3 % 71 + 1)
    h.update(std::string_view(text).substr(at, n));
  EXPECT_EQ(fulgur::runtime::to_hex(h.digest()), hex_sha256(text));
}

TEST(CompileCacheKey, EachPartChangesItAndPartsDoNotRunTogether) {
  const pjrt::CacheKey k = pjrt::compile_cache_key("program", "options", "plugin");
  EXPECT_EQ(k, pjrt::compile_cache_key("program", "options", "plugin"));
  EXPECT_NE(k, pjrt::compile_cache_key("program ", "options", "plugin"));
  EXPECT_NE(k, pjrt::compile_cache_key("program", "options2", "plugin"));
  EXPECT_NE(k, pjrt::compile_cache_key("program", "options", "plugin 2"));
  EXPECT_NE(pjrt::compile_cache_key("ab", "c", ""), pjrt::compile_cache_key("a", "bc", ""));
}

TEST(CompileCacheEntry, RoundTripsAndRefusesEveryFlippedByteAndEveryTruncation) {
  const pjrt::CacheKey key = key_of("k");
  const std::string payload = "serialized executable bytes";
  const std::string entry = pjrt::encode_cache_entry(key, payload);
  ASSERT_EQ(entry.size(), pjrt::kCacheHeaderBytes + payload.size());
  std::string why;
  const auto got = pjrt::decode_cache_entry(entry, key, &why);
  ASSERT_TRUE(got) << why;
  EXPECT_EQ(*got, payload);
  for (size_t i = 0; i < entry.size(); ++i) {
    std::string bad = entry;
    bad[i] ^= 0x01;
    EXPECT_FALSE(pjrt::decode_cache_entry(bad, key, &why)) << "byte " << i << " flipped was accepted";
  }
  for (size_t n = 0; n < entry.size(); ++n)
    EXPECT_FALSE(pjrt::decode_cache_entry(entry.substr(0, n), key, &why))
        << "the first " << n << " bytes were accepted";
  EXPECT_FALSE(pjrt::decode_cache_entry(entry + "x", key, &why));
  EXPECT_NE(why.find("trailing bytes"), std::string::npos) << why;
}

TEST(CompileCacheEntry, ReasonsNameWhatIsWrong) {
  const pjrt::CacheKey key = key_of("k");
  const std::string entry = pjrt::encode_cache_entry(key, "payload");
  std::string why;
  EXPECT_FALSE(pjrt::decode_cache_entry(entry, key_of("other"), &why));
  EXPECT_NE(why.find("written under another key (" + fulgur::runtime::to_hex(key) + ")"), std::string::npos) << why;
  EXPECT_FALSE(pjrt::decode_cache_entry("ELF\x7f not an entry", key, &why));
  EXPECT_NE(why.find("bad magic"), std::string::npos) << why;
  EXPECT_FALSE(pjrt::decode_cache_entry(entry.substr(0, entry.size() - 2), key, &why));
  EXPECT_NE(why.find("truncated"), std::string::npos) << why;
  std::string flipped = entry;
  flipped.back() ^= 0x40;
  EXPECT_FALSE(pjrt::decode_cache_entry(flipped, key, &why));
  EXPECT_EQ(why, "checksum mismatch");
  // A header claiming a huge payload is refused from the header alone.
  std::string huge = entry.substr(0, pjrt::kCacheHeaderBytes);
  huge[48 + 5] = 1;  // 2^40 bytes
  EXPECT_FALSE(pjrt::decode_cache_entry(huge, key, &why));
  EXPECT_NE(why.find("more than the limit"), std::string::npos) << why;
  std::string version = entry;
  version[8] = 7;
  EXPECT_FALSE(pjrt::decode_cache_entry(version, key, &why));
  EXPECT_NE(why.find("format version 7"), std::string::npos) << why;
}

TEST(CompileCacheFolder, IsMadePrivateAndAFolderOthersMayWriteIsNotUsed) {
  TempDir tmp;
  const std::string dir = tmp.path + "/a/b/cache";
  const pjrt::CompileCache cache(dir);
  ASSERT_TRUE(cache.usable());
  struct stat st {};
  ASSERT_EQ(::stat(dir.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  const pjrt::CacheKey key = key_of("k");
  ASSERT_TRUE(cache.store(key, "payload"));
  EXPECT_EQ(cache.load(key).value_or(""), "payload");
  EXPECT_EQ(files_in(dir).size(), 1u);  // no temporary file left

  const std::string shared = tmp.path + "/shared";
  fs::create_directory(shared);
  ::chmod(shared.c_str(), 0777);
  ::testing::internal::CaptureStderr();
  EXPECT_FALSE(pjrt::CompileCache(shared).usable());
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("writable by other users (mode 0777)"), std::string::npos) << err;

  const std::string file = tmp.path + "/file";
  write_bytes(file, "x");
  ::testing::internal::CaptureStderr();
  EXPECT_FALSE(pjrt::CompileCache(file).usable());
  EXPECT_NE(::testing::internal::GetCapturedStderr().find("is not a folder"), std::string::npos);
}

TEST(CompileCacheFolder, AnEntryOthersMayWriteOrASymbolicLinkIsNotRead) {
  TempDir tmp;
  const pjrt::CompileCache cache(tmp.path + "/cache");
  const pjrt::CacheKey a = key_of("a"), b = key_of("b");
  ASSERT_TRUE(cache.store(a, "payload a"));
  ::chmod(cache.entry_path(a).c_str(), 0666);
  ::testing::internal::CaptureStderr();
  EXPECT_FALSE(cache.load(a));
  std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("writable by other users"), std::string::npos) << err;
  ASSERT_TRUE(cache.store(a, "payload a"));  // replaced by a private file
  EXPECT_EQ(cache.load(a).value_or(""), "payload a");

  // b's name links to a valid entry written under b's key elsewhere.
  const std::string elsewhere = tmp.path + "/elsewhere.xla";
  write_bytes(elsewhere, pjrt::encode_cache_entry(b, "payload b"));
  ::chmod(elsewhere.c_str(), 0600);
  fs::create_symlink(elsewhere, cache.entry_path(b));
  ::testing::internal::CaptureStderr();
  EXPECT_FALSE(cache.load(b));
  err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("symbolic link"), std::string::npos) << err;
}

// Two processes writing one key at once, each many times with its own payload: the entry is
// always one whole payload, and no temporary file stays.
TEST(CompileCacheFolder, TwoProcessesWritingOneEntryAtOnceLeaveOneValidEntry) {
  TempDir tmp;
  const std::string dir = tmp.path + "/cache";
  const pjrt::CacheKey key = key_of("k");
  const std::string payloads[2] = {std::string(1 << 20, 'a'), std::string(1 << 20, 'b')};
  int go[2];
  ASSERT_EQ(::pipe(go), 0);
  pid_t pids[2];
  for (int i = 0; i < 2; ++i) {
    pids[i] = ::fork();
    if (pids[i] == 0) {
      ::close(go[1]);
      char c;
      while (::read(go[0], &c, 1) > 0) {
      }
      const pjrt::CompileCache cache(dir);
      bool ok = cache.usable();
      for (int n = 0; n < 30 && ok; ++n) {
        ok = cache.store(key, payloads[i]);
        const auto got = cache.load(key);  // the other's or its own, never a mix
        ok = ok && got && (*got == payloads[0] || *got == payloads[1]);
      }
      std::_Exit(ok ? 0 : 1);
    }
  }
  ::close(go[0]);
  ::close(go[1]);
  for (pid_t pid : pids) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  EXPECT_EQ(files_in(dir).size(), 1u);
  const auto got = pjrt::CompileCache(dir).load(key);
  ASSERT_TRUE(got);
  EXPECT_TRUE(*got == payloads[0] || *got == payloads[1]);
}

TEST(CompileCachePjrt, ASecondRunCompilesNothingAndGivesTheSameResults) {
  TempDir tmp;
  const std::string dir = tmp.path + "/cache";
  const ChildRun first = run(tmp.path + "/1", 3, {{"FULGUR_XLA_CACHE_DIR", dir}});
  ASSERT_EQ(first.exit_code, 0) << first.stderr_text;
  EXPECT_EQ(first.metrics.programs_compiled, 1);
  EXPECT_EQ(first.metrics.cache_misses, 1);
  EXPECT_EQ(first.metrics.cache_hits, 0);
  EXPECT_GT(first.metrics.cache_bytes_written, static_cast<int64_t>(pjrt::kCacheHeaderBytes));
  EXPECT_EQ(first.result, kExpected);
  const std::string entry = only_entry(dir);
  EXPECT_EQ(static_cast<int64_t>(fs::file_size(entry)), first.metrics.cache_bytes_written);

  const ChildRun second = run(tmp.path + "/2", 3, {{"FULGUR_XLA_CACHE_DIR", dir}});
  ASSERT_EQ(second.exit_code, 0) << second.stderr_text;
  EXPECT_EQ(second.metrics.programs_compiled, 0);
  EXPECT_EQ(second.metrics.cache_hits, 1);
  EXPECT_EQ(second.metrics.cache_misses, 0);
  EXPECT_EQ(second.metrics.cache_bytes_read, first.metrics.cache_bytes_written);
  EXPECT_EQ(second.metrics.cache_bytes_written, 0);
  EXPECT_EQ(second.result, first.result);
  EXPECT_EQ(second.stderr_text.find("compile cache"), std::string::npos) << second.stderr_text;

  // Another program is another entry.
  const ChildRun other = run(tmp.path + "/3", 4, {{"FULGUR_XLA_CACHE_DIR", dir}});
  EXPECT_EQ(other.metrics.programs_compiled, 1);
  EXPECT_EQ(files_in(dir).size(), 2u);
}

// A program the plugin cannot serialize (a reduction, which fulgur's default XLA_FLAGS make an
// XNNPACK fusion on the CPU plugin) runs all the same, said once, and is compiled again
// by the next process.
TEST(CompileCachePjrt, AProgramThePluginCannotSerializeRunsSaidOnceAndIsNotKept) {
  TempDir tmp;
  const std::string dir = tmp.path + "/cache";
  const std::string sum =
      "func.func @main(%a: tensor<4xf32>, %b: tensor<4xf32>) -> tensor<4xf32> {\n"
      "  %z = stablehlo.constant dense<0.0> : tensor<f32>\n"
      "  %0 = stablehlo.multiply %a, %b : tensor<4xf32>\n"
      "  %1 = stablehlo.reduce(%0 init: %z) applies stablehlo.add across dimensions = [0]\n"
      "      : (tensor<4xf32>, tensor<f32>) -> tensor<f32>\n"
      "  %2 = stablehlo.broadcast_in_dim %1, dims = [] : (tensor<f32>) -> tensor<4xf32>\n"
      "  return %2 : tensor<4xf32>\n}\n";
  // Said at debug level: a default run of the CPU plugin meets it every time and cannot act on it.
  for (const char* name : {"1", "2", "3"}) {
    const bool debug = std::string(name) != "3";
    const ChildRun r = run(tmp.path + "/" + name, 0,
                           {{"FULGUR_XLA_CACHE_DIR", dir}, {"FULGUR_LOG_LEVEL", debug ? "debug" : "info"}}, "",
                           nullptr, sum);
    ASSERT_EQ(r.exit_code, 0) << r.stderr_text;
    EXPECT_EQ(r.metrics.programs_compiled, 1);
    EXPECT_EQ(r.metrics.cache_misses, 1);
    EXPECT_EQ(r.result, std::vector<float>(4, 70.0f));
    EXPECT_EQ(r.stderr_text.find("a program is not kept, because the plugin cannot serialize") != std::string::npos,
              debug)
        << r.stderr_text;
  }
  EXPECT_TRUE(files_in(dir).empty());
}

// Damages the one entry of `dir` with `damage`, then runs again: the entry is refused with one
// warning containing `reason`, the program compiled and the entry replaced, which a third run
// loads.
void damaged_entry_is_recompiled(const std::function<void(const std::string&)>& damage, const std::string& reason) {
  TempDir tmp;
  const std::string dir = tmp.path + "/cache";
  const ChildRun first = run(tmp.path + "/1", 3, {{"FULGUR_XLA_CACHE_DIR", dir}});
  ASSERT_EQ(first.exit_code, 0) << first.stderr_text;
  damage(only_entry(dir));
  const ChildRun second = run(tmp.path + "/2", 3, {{"FULGUR_XLA_CACHE_DIR", dir}});
  ASSERT_EQ(second.exit_code, 0) << second.stderr_text;
  EXPECT_EQ(second.metrics.programs_compiled, 1);
  EXPECT_EQ(second.metrics.cache_hits, 0);
  EXPECT_EQ(second.metrics.cache_rejected, 1);
  EXPECT_EQ(second.result, kExpected);
  const std::string warning = "ignoring " + only_entry(dir) + ": " + reason;
  EXPECT_NE(second.stderr_text.find(warning), std::string::npos) << second.stderr_text;
  EXPECT_EQ(second.stderr_text.find("ignoring", second.stderr_text.find("ignoring") + 1), std::string::npos)
      << "warned more than once:\n" << second.stderr_text;
  const ChildRun third = run(tmp.path + "/3", 3, {{"FULGUR_XLA_CACHE_DIR", dir}});
  EXPECT_EQ(third.metrics.programs_compiled, 0);
  EXPECT_EQ(third.metrics.cache_hits, 1);
  EXPECT_EQ(third.result, kExpected);
}

TEST(CompileCachePjrt, AFlippedByteIsIgnoredWithAWarningAndRecompiled) {
  damaged_entry_is_recompiled(
      [](const std::string& path) {
        std::string bytes = fulgur::testing::read_file(path);
        bytes[pjrt::kCacheHeaderBytes + (bytes.size() - pjrt::kCacheHeaderBytes) / 2] ^= 0x10;
        write_bytes(path, bytes);
      },
      "checksum mismatch");
}

TEST(CompileCachePjrt, ATruncatedEntryIsIgnoredWithAWarningAndRecompiled) {
  damaged_entry_is_recompiled([](const std::string& path) { fs::resize_file(path, fs::file_size(path) / 2); },
                              "truncated");
}

TEST(CompileCachePjrt, AnEntryRenamedFromAnotherProgramIsRefused) {
  TempDir tmp;
  const std::string dir = tmp.path + "/cache";
  ASSERT_EQ(run(tmp.path + "/a", 3, {{"FULGUR_XLA_CACHE_DIR", dir}}).exit_code, 0);
  const std::string entry_a = only_entry(dir);
  ASSERT_EQ(run(tmp.path + "/b", 4, {{"FULGUR_XLA_CACHE_DIR", dir}}).exit_code, 0);
  std::string entry_b;
  for (const auto& p : files_in(dir))
    if (p.string() != entry_a) entry_b = p.string();
  ASSERT_FALSE(entry_b.empty());
  fs::rename(entry_a, entry_b);  // program 3's executable under program 4's name
  const ChildRun b = run(tmp.path + "/b2", 4, {{"FULGUR_XLA_CACHE_DIR", dir}});
  ASSERT_EQ(b.exit_code, 0) << b.stderr_text;
  EXPECT_EQ(b.metrics.cache_hits, 0);
  EXPECT_EQ(b.metrics.cache_rejected, 1);
  EXPECT_EQ(b.metrics.programs_compiled, 1);
  EXPECT_NE(b.stderr_text.find("written under another key"), std::string::npos) << b.stderr_text;
  EXPECT_EQ(b.result, (std::vector<float>{5 + 4, 12 + 4, 21 + 4, 32 + 4}));
}

TEST(CompileCachePjrt, TwoProcessesCompilingTheSameProgramAtOnceLeaveOneValidEntry) {
  TempDir tmp;
  const std::string dir = tmp.path + "/cache";
  int go[2];
  ASSERT_EQ(::pipe(go), 0);
  const pid_t a = start_run(tmp.path + "/a", 3, {{"FULGUR_XLA_CACHE_DIR", dir}}, "", go);
  const pid_t b = start_run(tmp.path + "/b", 3, {{"FULGUR_XLA_CACHE_DIR", dir}}, "", go);
  ::close(go[0]);
  ::close(go[1]);  // both compile now
  const ChildRun ra = finish_run(a, tmp.path + "/a"), rb = finish_run(b, tmp.path + "/b");
  ASSERT_EQ(ra.exit_code, 0) << ra.stderr_text;
  ASSERT_EQ(rb.exit_code, 0) << rb.stderr_text;
  EXPECT_EQ(ra.result, kExpected);
  EXPECT_EQ(rb.result, kExpected);
  EXPECT_EQ(files_in(dir).size(), 1u);
  const ChildRun third = run(tmp.path + "/c", 3, {{"FULGUR_XLA_CACHE_DIR", dir}});
  EXPECT_EQ(third.metrics.cache_hits, 1);
  EXPECT_EQ(third.metrics.cache_rejected, 0);
  EXPECT_EQ(third.result, kExpected);
}

TEST(CompileCachePjrt, OffTurnsItOffAndTheVariableMovesTheDefault) {
  TempDir tmp;
  const std::string default_dir = tmp.path + "/default";
  const ChildRun off = run(tmp.path + "/off", 3, {{"FULGUR_XLA_CACHE_DIR", "off"}}, default_dir);
  ASSERT_EQ(off.exit_code, 0) << off.stderr_text;
  EXPECT_EQ(off.metrics.programs_compiled, 1);
  EXPECT_EQ(off.metrics.cache_hits + off.metrics.cache_misses + off.metrics.cache_bytes_written, 0);
  EXPECT_FALSE(fs::exists(default_dir));

  const ChildRun by_default = run(tmp.path + "/default_run", 3, {}, default_dir);
  EXPECT_EQ(by_default.metrics.cache_misses, 1);
  EXPECT_EQ(files_in(default_dir).size(), 1u);
  const std::string moved = tmp.path + "/moved";
  const ChildRun elsewhere = run(tmp.path + "/moved_run", 3, {{"FULGUR_XLA_CACHE_DIR", moved}}, default_dir);
  EXPECT_EQ(elsewhere.metrics.cache_misses, 1);  // not the default folder's entry
  EXPECT_EQ(files_in(moved).size(), 1u);
}

// Two fits of one model in fresh processes with one default_root_dir: the second loads every
// program from <default_root_dir>/.xla_cache, compiles none, and ends with the same parameters
// to the bit (the convolution's host-kernel custom call included).
TEST(CompileCacheTrainer, ASecondFitInTheSameRootDirCompilesNothingAndEndsTheSame) {
  TempDir tmp;
  const ChildRun first = fit_in_child(tmp.path, tmp.path + "/first");
  ASSERT_EQ(first.exit_code, 0) << first.stderr_text;
  EXPECT_GT(first.metrics.programs_compiled, 0);
  EXPECT_EQ(first.metrics.cache_misses, first.metrics.programs_compiled);
  EXPECT_EQ(first.metrics.cache_hits, 0);
  ASSERT_TRUE(fs::is_directory(tmp.path + "/.xla_cache"));
  EXPECT_EQ(static_cast<int64_t>(files_in(tmp.path + "/.xla_cache").size()), first.metrics.programs_compiled)
      << first.stderr_text;
  const ChildRun second = fit_in_child(tmp.path, tmp.path + "/second");
  ASSERT_EQ(second.exit_code, 0) << second.stderr_text;
  EXPECT_EQ(second.metrics.programs_compiled, 0);
  EXPECT_EQ(second.metrics.cache_hits, first.metrics.programs_compiled);
  EXPECT_EQ(second.metrics.cache_rejected, 0);
  ASSERT_EQ(second.result.size(), 2u * 1 * 2 * 2 + 2 + 6 + 1);
  EXPECT_EQ(second.result, first.result);
}
