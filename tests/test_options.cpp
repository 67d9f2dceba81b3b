// SPDX-License-Identifier: Apache-2.0
#include "public_api.h"
#include "support.h"

#include <fulgur/accelerators/accelerator.h>
#include <fulgur/plugins/precision/precision.h>
#include <fulgur/strategies/ddp.h>
#include <fulgur/strategies/registry.h>
#include <fulgur/strategies/single_device.h>
#include <fulgur/strategies/xla.h>

#include <fulgur/environment.h>
#include <gtest/gtest.h>

#include "runtime/env.h"
#include "runtime/env_vars.h"
#include "runtime/threads.h"

#include <dlfcn.h>
#include <sys/wait.h>
#include <sched.h>

#include <array>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <regex>
#include <set>
#include <sstream>

using namespace fulgur;

namespace {

// Runs f, expects std::invalid_argument whose message holds every needle.
template <typename F>
void expect_invalid(F&& f, std::vector<std::string> needles) {
  try {
    f();
    ADD_FAILURE() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    for (const auto& n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
  }
}

}  // namespace

TEST(Options, UnknownNamesListTheValidChoices) {
  expect_invalid([] { Trainer t(TrainerOptions().accelerator("npu")); }, {"'npu'", "\"cpu\"", "\"cuda\"", "\"xla\""});
  expect_invalid([] { Trainer t(TrainerOptions().strategy("fsdp")); }, {"'fsdp'", "\"ddp\"", "\"xla\""});
  expect_invalid([] { Trainer t(TrainerOptions().precision("8-bit")); }, {"'8-bit'", "\"bf16-true\""});
  expect_invalid([] { Trainer t(TrainerOptions().precision("16-true")); }, {"'16-true'", "bf16-true"});
}

// Issue 35, item 4: a comm hook is parsed by its Python name, refused for one-process
// strategies (nothing to reduce), and reaches the strategy's ParallelOptions.
TEST(Options, DdpCommHookIsParsedRefusedOnOneProcessAndPassedOn) {
  EXPECT_EQ(parse_ddp_comm_hook("bf16_compress_hook"), DDPCommHook::kBf16Compress);
  EXPECT_EQ(parse_ddp_comm_hook("none"), DDPCommHook::kNone);
  expect_invalid([] { parse_ddp_comm_hook("fp16_compress_hook"); }, {"'fp16_compress_hook'", "\"bf16_compress_hook\""});
  const auto bf16 = StrategyRequest().accelerator("cpu").ddp_comm_hook(DDPCommHook::kBf16Compress);
  expect_invalid([&] { make_strategy(StrategyRequest(bf16).strategy("single_device")); }, {"'single_device'", "ddp_comm_hook"});
  auto ddp = std::dynamic_pointer_cast<DDPStrategy>(make_strategy(StrategyRequest(bf16).strategy("ddp").devices("2")));
  ASSERT_TRUE(ddp);
  EXPECT_EQ(ddp->parallel_options().ddp_comm_hook(), DDPCommHook::kBf16Compress);
}

TEST(Options, BadDevices) {
  XLAAccelerator xla;
  CPUAccelerator cpu;
  expect_invalid([&] { parse_devices("0", xla); }, {"devices='0'", "zero"});
  expect_invalid([&] { parse_devices("-3", xla); }, {"devices='-3'", "negative"});
  expect_invalid([&] { parse_devices("999", cpu); }, {"devices='999'", "more devices than exist"});
  expect_invalid([&] { parse_devices("two", cpu); }, {"devices='two'", "allowed"});
  expect_invalid([&] { parse_devices("0,0", cpu); }, {"twice"});
  EXPECT_EQ(parse_devices("1", cpu), (std::vector<int64_t>{0}));
  EXPECT_EQ(parse_devices("auto", cpu).size(), 1u);
  EXPECT_EQ(parse_devices("0,1", xla), (std::vector<int64_t>{0, 1}));
  expect_invalid([] { Trainer t(TrainerOptions().accelerator("cpu").devices(0)); }, {"devices='0'"});
}

// The spec and reliability item 13: negatives are refused, -1 included, on
// both accelerators (-1 is not Lightning's "all devices"; that is "auto").
TEST(Options, MinusOneDevicesIsRefusedOnEveryAccelerator) {
  expect_invalid([] { parse_devices("-1", XLAAccelerator()); }, {"devices='-1'", "negative", "accelerator xla", "\"auto\""});
  expect_invalid([] { parse_devices("-1", CPUAccelerator()); }, {"devices='-1'", "negative", "accelerator cpu", "\"auto\""});
  expect_invalid([] { Trainer t(TrainerOptions().accelerator("xla").devices("-1")); }, {"devices='-1'", "negative"});
  expect_invalid([] { Trainer t(TrainerOptions().accelerator("cpu").devices("-1")); }, {"devices='-1'", "negative"});
}

TEST(Options, XlaNumDevicesDecidesAuto) {
  setenv("XLA_NUM_DEVICES", "3", 1);
  EXPECT_EQ(parse_devices("auto", XLAAccelerator()).size(), 3u);
  setenv("XLA_NUM_DEVICES", "x", 1);
  expect_invalid([] { XLAAccelerator().auto_device_count(); }, {"XLA_NUM_DEVICES='x'"});
  unsetenv("XLA_NUM_DEVICES");
}

// "cuda" (and Lightning's alias "gpu") where no CUDA device is visible: an error that says why.
TEST(Accelerators, CudaWithoutAVisibleDeviceIsAClearError) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "this machine has " << cuda_device_count() << " CUDA devices";
  EXPECT_FALSE(cuda_unavailable_reason().empty());
  for (const char* name : {"cuda", "gpu"}) {
    expect_invalid([&] { Trainer t(TrainerOptions().accelerator(name)); },
                   {"accelerator '" + std::string(name) + "' asks for CUDA devices, but none is visible",
                    cuda_unavailable_reason(), "\"cpu\""});
  }
}

// Lightning's accelerator="auto": cuda when there is a GPU; else xla (the default strategy) or
// cpu (a CPU strategy named). An xla strategy stays on xla either way.
TEST(Accelerators, AutoPicksCudaWhenThereIsAGpuElseXlaOrCpu) {
  const bool gpu = cuda_device_count() > 0;
  std::cout << "[ INFO     ] CUDA devices visible: " << cuda_device_count()
            << (gpu ? "" : " (" + cuda_unavailable_reason() + ")") << "\n";
  Trainer plain(TrainerOptions().accelerator("auto").devices(1));
  EXPECT_EQ(plain.strategy().accelerator().name(), gpu ? "cuda" : "xla");
  Trainer ddp(TrainerOptions().accelerator("auto").strategy("ddp").devices(1));
  EXPECT_EQ(ddp.strategy().accelerator().name(), gpu ? "cuda" : "cpu");
  Trainer xla(TrainerOptions().accelerator("auto").strategy("single_xla").devices(1));
  EXPECT_EQ(xla.strategy().accelerator().name(), "xla");
  if (gpu) {
    Trainer cuda(TrainerOptions().accelerator("cuda").devices(1));
    EXPECT_EQ(cuda.strategy().root_device(), c10::Device(c10::kCUDA, 0));
    expect_invalid([] { Trainer t(TrainerOptions().accelerator("cuda").strategy("xla").devices(1)); },
                   {"strategy 'xla'", "accelerator is 'cuda'"});
  }
}

// Local rank k owns the k-th device of the strategy's list (Lightning's parallel_devices[local_rank]).
TEST(Accelerators, ARankOwnsTheDeviceOfItsPlaceInTheDeviceList) {
  struct Recording : CPUAccelerator {
    mutable std::vector<int64_t> asked;
    c10::Device device(int64_t index) const override {
      asked.push_back(index);
      return CPUAccelerator::device(index);
    }
  };
  auto acc = std::make_shared<Recording>();
  DDPStrategy ddp(acc, {3, 1});
  ddp.root_device();  // rank 0 before launch
  ASSERT_FALSE(acc->asked.empty());
  EXPECT_EQ(acc->asked.back(), 3);
}

TEST(Options, LoopBounds) {
  expect_invalid([] { Trainer t(TrainerOptions().max_epochs(-2)); }, {"max_epochs=-2"});
  expect_invalid([] { Trainer t(TrainerOptions().max_steps(-5)); }, {"max_steps=-5"});
  expect_invalid([] { Trainer t(TrainerOptions().accumulate_grad_batches(0)); }, {"accumulate_grad_batches=0"});
  expect_invalid([] { Trainer t(TrainerOptions().limit_train_batches(1.5)); }, {"limit_train_batches"});
  expect_invalid([] { Trainer t(TrainerOptions().gradient_clip_algorithm("l3")); }, {"'l3'", "\"norm\""});
}

TEST(Options, StrategyMustFitTheAccelerator) {
  expect_invalid([] { Trainer t(TrainerOptions().accelerator("cpu").strategy("xla").devices(2)); },
                 {"strategy 'xla'", "accelerator is 'cpu'"});
  expect_invalid([] { Trainer t(TrainerOptions().accelerator("cpu").strategy("single_device").devices(2)); },
                 {"single_device", "gives 2"});
}

TEST(Options, XlaStrategyRefusesForeignPlugins) {
  expect_invalid([] { XLAStrategy s({0, 1}, std::make_shared<TorchCheckpointIO>()); }, {"XLACheckpointIO"});
  expect_invalid([] { XLAStrategy s({0, 1}, nullptr, std::make_shared<Precision>()); }, {"XLAPrecision"});
}

// A strategy object decides whether loaders are sharded; asking the Trainer for
// the opposite of what it does is refused; so is a CSV logger flush interval below 1.
TEST(Options, ShardingSwitchAndLoggerFlushMustBeConsistent) {
  auto shards = std::make_shared<XLAStrategy>(std::vector<int64_t>{0, 1});
  expect_invalid([&] { Trainer t(TrainerOptions().strategy(shards).use_distributed_sampler(false)); },
                 {"use_distributed_sampler=false", "ParallelOptions::use_distributed_sampler"});
  auto as_given = ParallelOptions().use_distributed_sampler(false);
  auto unsharded = std::make_shared<XLAStrategy>(std::vector<int64_t>{0, 1}, nullptr, nullptr, as_given);
  Trainer t(TrainerOptions().strategy(unsharded).use_distributed_sampler(false));
  expect_invalid([] { CSVLogger l(CSVLoggerOptions(".").flush_logs_every_n_steps(0)); }, {"flush_logs_every_n_steps=0", ">= 1"});
}

// One `strategy` field takes a name or an object; a null one of either is
// refused, naming the valid names.
TEST(Options, StrategyTakesANameOrAnObject) {
  auto object = std::make_shared<DDPStrategy>(std::make_shared<CPUAccelerator>(), std::vector<int64_t>{0, 1});
  Trainer by_object(TrainerOptions().strategy(object));
  EXPECT_EQ(&by_object.strategy(), object.get());
  const std::string name = "ddp";
  Trainer by_name(TrainerOptions().accelerator("cpu").devices(2).strategy(name));
  EXPECT_NE(dynamic_cast<DDPStrategy*>(&by_name.strategy()), nullptr);
  expect_invalid([] { Trainer t(TrainerOptions().strategy(std::shared_ptr<DDPStrategy>())); },
                 {"strategy: the Strategy object (or name) given is null", "ddp", "single_device"});
  expect_invalid([] { Trainer t(TrainerOptions().strategy(static_cast<const char*>(nullptr))); },
                 {"strategy: the Strategy object (or name) given is null", "xla_debug"});
}

TEST(Options, ReduceOpNames) {
  EXPECT_EQ(parse_reduce_op("MEAN"), ReduceOp::kMean);
  EXPECT_EQ(parse_reduce_op("avg"), ReduceOp::kMean);
  EXPECT_EQ(parse_reduce_op("Sum"), ReduceOp::kSum);
  EXPECT_EQ(parse_reduce_op("max"), ReduceOp::kMax);
  expect_invalid([] { parse_reduce_op("median"); }, {"'median'", "\"sum\""});
}

TEST(Options, RanksAndBroadcastBeforeLaunch) {
  XLAStrategy s({0, 1});
  EXPECT_EQ(s.global_rank(), 0);
  EXPECT_EQ(s.local_rank(), 0);
  EXPECT_EQ(s.node_rank(), 0);
  EXPECT_EQ(s.world_size(), 1);
  try {
    s.root_device();
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "Accessing the XLA device before processes have spawned is not allowed.");
  }
  auto t = torch::arange(3);
  EXPECT_TRUE(torch::equal(s.all_gather(t), t));
  EXPECT_EQ(s.broadcast(c10::IValue(std::string("x"))).toStringRef(), "x");
  s.barrier("before launch");
  // A non-tensor passes through reduce unchanged; a bad op is still refused.
  EXPECT_EQ(s.Strategy::reduce(c10::IValue(int64_t(5)), "sum").toInt(), 5);
  expect_invalid([&] { s.Strategy::reduce(c10::IValue(int64_t(5)), "nope"); }, {"'nope'"});
  // The mean of an integer tensor is floating point.
  EXPECT_TRUE(s.reduce(torch::tensor({1, 2}), "mean").is_floating_point());
}

// Issue 32, C12: what strategy.h and the GUIDE say of one process. all_gather gives its input
// back, not [1, *shape] (as Lightning's single-device strategy), with sync_grads too; reduce of an
// IValue reduces a tensor and returns anything else as it is, a dict holding a tensor included.
TEST(Options, OneProcessAllGatherReturnsItsInputAndReduceLeavesADictOfTensorsAsItIs) {
  SingleDeviceStrategy s(c10::Device(c10::kCPU), std::make_shared<CPUAccelerator>());
  const auto t = torch::arange(6.0).view({2, 3});
  EXPECT_TRUE(s.all_gather(t).is_same(t));
  EXPECT_TRUE(s.all_gather(t, true).is_same(t));
  c10::Dict<std::string, at::Tensor> d;
  d.insert("x", torch::tensor({1.0, 2.0}));
  const c10::IValue r = s.Strategy::reduce(c10::IValue(d), "sum");
  ASSERT_TRUE(r.isGenericDict());
  EXPECT_TRUE(r.toGenericDict().at("x").toTensor().is_same(d.at("x")));
  EXPECT_TRUE(s.Strategy::reduce(c10::IValue(t), "sum").toTensor().equal(t));
}

TEST(Options, XlaCheckpointIORefusesStorageOptions) {
  fulgur::testing::TempDir dir;
  XLACheckpointIO io;
  expect_invalid([&] { io.save_checkpoint(make_dict(), dir.path + "/x.ckpt", {{"compress", "1"}}); },
                 {"storage_options", "compress"});
}

TEST(Options, CallbackOptions) {
  expect_invalid([] { ModelCheckpoint m(ModelCheckpointOptions().mode("mid")); }, {"'mid'"});
  expect_invalid([] { ModelCheckpoint m(ModelCheckpointOptions().save_top_k(-2)); }, {"save_top_k=-2"});
  expect_invalid([] { EarlyStopping e(EarlyStoppingOptions("x").mode("up")); }, {"'up'"});
  expect_invalid([] { LearningRateMonitor m("hour"); }, {"'hour'"});
}

// public_api.cpp includes only <fulgur/fulgur.h>; each name it used compiled and worked.
TEST(PublicApi, FulgurHDeclaresWhatAUserProgramNeeds) {
  EXPECT_EQ(fulgur::testing::names_from_fulgur_h(),
            (std::vector<std::string>{"ParallelStrategy::reduce(Tensor)", "ParallelStrategy::reduce(IValue)",
                                      "XLAStrategy", "strategy_names", "DeviceLoader", "Collectives",
                                      "BasePredictionWriter", "XLAPrecision", "ModelSummary"}));
}

// The example data sets (MNIST, the character data set) are not part of the library's umbrella header.
TEST(PublicApi, FulgurHLeavesOutTheExampleDataSets) {
  const std::string header = fulgur::testing::read_file(std::string(FULGUR_SOURCE_DIR) + "/include/fulgur/fulgur.h");
  ASSERT_FALSE(header.empty());
  EXPECT_EQ(header.find("#include <fulgur/data/mnist.h>"), std::string::npos);
  EXPECT_EQ(header.find("#include <fulgur/data/text.h>"), std::string::npos);
}

// Lightning's devices=[0, 1]; one index is an index, not a count.
TEST(Options, DevicesTakeAListOfIndicesOnCpuAndXla) {
  for (const std::string accelerator : {"cpu", "xla"}) {
    const std::string strategy = accelerator == "cpu" ? "ddp" : "xla";
    Trainer two(TrainerOptions().accelerator(accelerator).strategy(strategy).devices(std::vector<int64_t>{0, 1}));
    auto* parallel = dynamic_cast<ParallelStrategy*>(&two.strategy());
    ASSERT_NE(parallel, nullptr) << accelerator;
    EXPECT_EQ(parallel->parallel_devices(), (std::vector<int64_t>{0, 1})) << accelerator;
    Trainer one(TrainerOptions().accelerator(accelerator).strategy(strategy).devices(std::vector<int64_t>{1}));
    parallel = dynamic_cast<ParallelStrategy*>(&one.strategy());
    ASSERT_NE(parallel, nullptr) << accelerator;
    EXPECT_EQ(parallel->parallel_devices(), (std::vector<int64_t>{1})) << accelerator;

    const std::string range = "[0, ";
    auto refused = [&](std::vector<int64_t> indices, std::vector<std::string> parts) {
      parts.push_back(range);
      parts.push_back("accelerator " + accelerator);
      expect_invalid([&] { Trainer t(TrainerOptions().accelerator(accelerator).strategy(strategy).devices(indices)); },
                     parts);
    };
    refused({0, 0}, {"devices='0,0'", "twice"});
    refused({-1, 0}, {"devices='-1,0'", "index -1"});
    refused({0, 100000}, {"devices='0,100000'", "index 100000", "does not exist"});
    refused({}, {"names no device"});
  }
}

// state_dict is a copy: writing into what it returns leaves the parameter alone.
TEST(Checkpoint, StateDictOfACpuModuleIsACopy) {
  fulgur::testing::TinyRegression m;
  const at::Tensor before = m.fc->weight.detach().clone();
  auto sd = state_dict(m);
  sd.at("fc.weight").toTensor().fill_(42.0);
  EXPECT_TRUE(torch::equal(m.fc->weight.detach(), before));
  EXPECT_FALSE(torch::equal(sd.at("fc.weight").toTensor(), before));
}

#ifdef FULGUR_TCMALLOC_ON
// fulgur's programs link tcmalloc (FULGUR_TCMALLOC, on by default): this test's
// malloc is tcmalloc's, and the dynamic loader lists it among the programs'
// libraries (LD_TRACE_LOADED_OBJECTS is what ldd sets). A link that drops the
// library (--as-needed: nothing names its symbols) fails here.
TEST(Build, FulgursProgramsAllocateWithTcmalloc) {
  Dl_info info{};
  ASSERT_NE(dladdr(dlsym(RTLD_DEFAULT, "malloc"), &info), 0);
  EXPECT_NE(std::string(info.dli_fname).find("tcmalloc"), std::string::npos) << "malloc is from " << info.dli_fname;
  for (const char* name : {"mnist", "charlm", "fulgur_bench"}) {
    const std::string cmd = "LD_TRACE_LOADED_OBJECTS=1 " + fulgur::testing::program(name);
    FILE* p = popen(cmd.c_str(), "r");
    ASSERT_NE(p, nullptr) << cmd;
    std::string out;
    char buf[4096];
    for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
    EXPECT_EQ(pclose(p), 0) << cmd;
    EXPECT_NE(out.find("libtcmalloc_minimal"), std::string::npos) << name << "'s libraries:\n" << out;
  }
}
#endif

// The filename template's formats are Python's, as Lightning users write them ({epoch:02d} gives
// epoch=01); a format that is not one of them is refused when the callback is made (it used to go
// into printf: {val_loss:d} was undefined behaviour and {x:n} wrote memory).
TEST(Options, ModelCheckpointFilenameTakesLightningsFormatsAndRefusesOthers) {
  ModelCheckpoint c(ModelCheckpointOptions().filename("{epoch:02d}-{step:05d}-{val_loss:.3f}-{acc:8.2e}-{x}-{y:G}"));
  EXPECT_EQ(c.format_name(1, 42, {{"val_loss", 0.12345}, {"acc", 0.5}, {"x", 2.0}, {"y", 1e300 * 1e300}}),
            "epoch=01-step=00042-val_loss=0.123-acc=5.00e-01-x=2.0000-y=INF");
  EXPECT_EQ(ModelCheckpoint(ModelCheckpointOptions().filename("{val_loss:.20f}")).format_name(0, 0, {{"val_loss", 1e40}}).size(),
            std::string("val_loss=").size() + 41 + 1 + 20);  // no fixed-size buffer cuts it
  for (const std::string bad : {"{val_loss:d}", "{x:n}", "{x:%n}", "{x:s}", "{epoch:.2f}", "{step:x}", "{x:1000f}",
                                "{x:.3}", "{x:>8.3f}"}) {
    SCOPED_TRACE(bad);
    const std::string spec = bad.substr(bad.find(':') + 1, bad.size() - bad.find(':') - 2);
    expect_invalid([&] { ModelCheckpoint m(ModelCheckpointOptions().filename(bad)); }, {"'" + spec + "'", "is not allowed"});
  }
  expect_invalid([] { ModelCheckpoint m(ModelCheckpointOptions().filename("{epoch")); }, {"unclosed '{'"});
}

// One version, written in include/fulgur/version.h: CMake's project version, fulgur::version(),
// every checkpoint and the programs' --version say the same.
TEST(Version, IsTheProjectsAndEveryCheckpointAndProgramSaysIt) {
  EXPECT_EQ(fulgur::version(), FULGUR_PROJECT_VERSION);
  fulgur::testing::TempDir dir;
  fulgur::testing::TinyRegression m;
  Trainer t(TrainerOptions().accelerator("cpu").devices(1).max_epochs(1).default_root_dir(dir.path).logger(false)
                .enable_progress_bar(false).enable_model_summary(false).num_sanity_val_steps(0)
                .callbacks({std::make_shared<ModelCheckpoint>(ModelCheckpointOptions().dirpath(dir.path + "/ck").save_last(true))}));
  t.fit(m, std::make_shared<DataLoader>(fulgur::testing::regression_data(16), DataLoaderOptions(8)));
  const std::string last = dir.path + "/ck/last.ckpt";
  Checkpoint ck = TorchCheckpointIO().load_checkpoint(last);
  EXPECT_EQ(ck.at("fulgur_version").toStringRef(), fulgur::version());
  EXPECT_EQ(ck.at("fulgur_format_version").toInt(), FULGUR_CHECKPOINT_FORMAT_VERSION);
  // A checkpoint of a newer format is refused, naming both fulgurs.
  ck.insert_or_assign("fulgur_format_version", static_cast<int64_t>(FULGUR_CHECKPOINT_FORMAT_VERSION + 1));
  ck.insert_or_assign("fulgur_version", std::string("9.0.0"));
  TorchCheckpointIO().save_checkpoint(ck, dir.path + "/newer.ckpt");
  fulgur::testing::TinyRegression again;
  Trainer t2(TrainerOptions().accelerator("cpu").devices(1).max_epochs(2).default_root_dir(dir.path).logger(false)
                 .enable_progress_bar(false).enable_model_summary(false).enable_checkpointing(false));
  try {
    t2.fit(again, std::make_shared<DataLoader>(fulgur::testing::regression_data(16), DataLoaderOptions(8)), nullptr,
           dir.path + "/newer.ckpt");
    ADD_FAILURE() << "a newer checkpoint format was read";
  } catch (const std::exception& e) {
    const std::string what = e.what();
    for (const std::string& part : {std::string("written by fulgur 9.0.0"), "this fulgur " + fulgur::version(), std::string("checkpoint format 2")})
      EXPECT_NE(what.find(part), std::string::npos) << part << " not in: " << what;
  }
  for (const char* prog : {"mnist", "charlm", "fulgur-plot"}) {
    FILE* p = ::popen((fulgur::testing::program(prog) + " --version").c_str(), "r");
    ASSERT_NE(p, nullptr);
    char buf[256] = {};
    const size_t n = std::fread(buf, 1, sizeof buf - 1, p);
    EXPECT_EQ(::pclose(p), 0) << prog;
    EXPECT_EQ(std::string(buf, n), std::string(prog) + " (fulgur " + fulgur::version() + ")\n");
  }
}

// --- Environment variables (issue 32, item C10) ---------------------------

namespace {

const char* kTableBegin = "<!-- environment table: generated from src/runtime/env_vars.cpp; a test keeps it equal -->\n";
const char* kTableEnd = "<!-- end of environment table -->";

// Sets one variable for the scope and restores what was there.
struct ScopedEnv {
  ScopedEnv(const char* name, const char* value) : name(name) {
    if (const char* old = std::getenv(name)) before = old;
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (before) setenv(name, before->c_str(), 1);
    else unsetenv(name);
  }
  const char* name;
  std::optional<std::string> before;
};

}  // namespace

// The README's list of variables is the table, row for row.
TEST(Environment, ReadmeListsExactlyTheTable) {
  const std::string readme = fulgur::testing::read_file(std::string(FULGUR_SOURCE_DIR) + "/README.md");
  const auto begin = readme.find(kTableBegin);
  const auto end = readme.find(kTableEnd);
  ASSERT_NE(begin, std::string::npos) << "README.md lacks the line " << kTableBegin;
  ASSERT_NE(end, std::string::npos) << "README.md lacks the line " << kTableEnd;
  const std::string listed = readme.substr(begin + std::strlen(kTableBegin), end - begin - std::strlen(kTableBegin));
  const std::string table = runtime::environment_table_markdown();
  EXPECT_EQ(listed, table) << "README.md's environment table differs from src/runtime/env_vars.cpp; put this between "
                              "the two marker lines:\n"
                           << table;
}

// Every variable a source file names when reading the environment is in the
// table (the names given to the env.h readers, and the launcher's own in
// worker_env.h), each row is there once, and nothing calls getenv but env.h
// and the table itself.
// The README's first example is examples/readme_example.cpp (from its first #include), which
// CTest builds and runs: the README cannot show code that does not compile.
TEST(Readme, FirstExampleIsTheProgramCTestRuns) {
  const std::string readme = fulgur::testing::read_file(std::string(FULGUR_SOURCE_DIR) + "/README.md");
  std::string program = fulgur::testing::read_file(std::string(FULGUR_SOURCE_DIR) + "/examples/readme_example.cpp");
  program = program.substr(program.find("#include <fulgur/fulgur.h>"));
  const auto at = readme.find("```cpp\n" + program + "```\n");
  ASSERT_NE(at, std::string::npos) << "README.md does not show examples/readme_example.cpp from its first #include";
  EXPECT_LT(at, readme.find("## Installing")) << "the example is not on the README's first screen";
}

TEST(Environment, HelpLinesComeFromTheTableAndAnUnknownNameIsAnError) {
  const std::string help = fulgur::environment_help({"PJRT_DEVICE", "MASTER_PORT"});
  EXPECT_EQ(help.substr(0, 15), "  PJRT_DEVICE  ");
  EXPECT_NE(help.find(runtime::environment_variable("PJRT_DEVICE").doc), std::string::npos) << help;
  EXPECT_NE(help.find("\n  MASTER_PORT  "), std::string::npos) << help;
  EXPECT_EQ(help.find('`'), std::string::npos) << help;
  try {
    fulgur::environment_help({"PJRT_DEVIC"});
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("'PJRT_DEVIC'"), std::string::npos) << e.what();
  }
}

TEST(Environment, EverySourceReadsOnlyVariablesOfTheTable) {
  std::set<std::string> names;
  for (const auto& v : runtime::environment_variables()) EXPECT_TRUE(names.insert(v.name).second) << v.name << " twice";
  const std::regex read(R"re((?:env_value|env_set|env_string|env_int|env_required|env_port|env_or_empty|\benv)\(\s*"([A-Za-z0-9_]+)")re");
  const std::regex launcher_name(R"re(inline constexpr const char\* k\w+ = "([A-Z0-9_]+)")re");
  int reads = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(std::string(FULGUR_SOURCE_DIR) + "/src")) {
    const std::string ext = e.path().extension().string();
    if (ext != ".cpp" && ext != ".h") continue;
    const std::string rel = std::filesystem::relative(e.path(), FULGUR_SOURCE_DIR).string();
    const std::string text = fulgur::testing::read_file(e.path().string());
    if (rel != "src/runtime/env.h" && rel != "src/runtime/env_vars.cpp") {
      EXPECT_EQ(text.find("getenv("), std::string::npos) << rel << " reads the environment without runtime/env.h";
    }
    for (const std::regex& re : {read, launcher_name}) {
      if (&re == &launcher_name && rel != "src/launchers/worker_env.h") continue;
      for (std::sregex_iterator m(text.begin(), text.end(), re), none; m != none; ++m) {
        ++reads;
        EXPECT_TRUE(names.count((*m)[1].str())) << rel << " reads " << (*m)[1].str() << ", which the table does not list";
      }
    }
  }
  EXPECT_GT(reads, 30);
  EXPECT_THROW(runtime::env_value("FULGUR_NOT_IN_THE_TABLE"), std::logic_error);
}

// A malformed value of any variable in the table is refused when the Trainer
// is made, naming the variable, the value and what is allowed; well-formed
// values pass.
TEST(Environment, MalformedValueIsRefusedWhenTheTrainerIsMade) {
  const std::vector<std::array<const char*, 3>> bad = {
      {"MASTER_PORT", "70000", "MASTER_PORT='70000' is not valid: a TCP port, an integer in [0, 65535]"},
      {"OMP_NUM_THREADS", "four", "OMP_NUM_THREADS='four' is not valid: positive integers separated by commas"},
      {"OMP_NUM_THREADS", "4,", "OMP_NUM_THREADS='4,' is not valid"},
      {"WORLD_SIZE", "0", "WORLD_SIZE='0' is not valid: a positive integer"},
      {"LOCAL_WORLD_SIZE", "2x", "LOCAL_WORLD_SIZE='2x' is not valid: a positive integer"},
      {"FULGUR_FUSED_OPTIMIZER", "yes", "FULGUR_FUSED_OPTIMIZER='yes' is not valid: on, 1, off, 0 (unset: on)"},
      {"OMP_WAIT_POLICY", "spin", "OMP_WAIT_POLICY='spin' is not valid: ACTIVE, PASSIVE"},
      {"PJRT_DEVICE", "GPU", "PJRT_DEVICE='GPU' is not valid: CPU, TPU, CUDA"},
      {"SLURM_JOB_ID", "abc", "SLURM_JOB_ID='abc' is not valid: text ending in digits"},
      {"XLA_NUM_DEVICES", "-2", "XLA_NUM_DEVICES='-2' is not valid: a positive integer"},
  };
  for (const auto& [name, value, message] : bad) {
    ScopedEnv env(name, value);
    expect_invalid([] { Trainer t(TrainerOptions().accelerator("cpu").devices(1)); }, {message});
  }
  ScopedEnv threads("OMP_NUM_THREADS", "4,2");
  ScopedEnv wait("OMP_WAIT_POLICY", "passive");
  ScopedEnv port("MASTER_PORT", "29500");
  EXPECT_NO_THROW(Trainer(TrainerOptions().accelerator("cpu").devices(1)));
}

// The core count behind the thread defaults honours cgroup v2's CPU quota,
// read from a cgroup folder tree and a /proc/self/cgroup of the test's own
// (the container's cannot be changed from a test): the tightest quota of the
// process's cgroup and its ancestors, rounded up.
TEST(Threads, CgroupCpuMaxOfTheCgroupAndItsAncestorsBoundsTheCores) {
  fulgur::testing::TempDir dir;
  const std::string root = dir.path + "/cgroup", self = dir.path + "/self_cgroup";
  std::filesystem::create_directories(root + "/job/step");
  auto write = [](const std::string& path, const std::string& text) { std::ofstream(path) << text; };
  write(self, "0::/job/step\n");
  write(root + "/cpu.max", "max 100000\n");
  write(root + "/job/cpu.max", "250000 100000\n");  // 2.5 cores
  write(root + "/job/step/cpu.max", "max 100000\n");
  EXPECT_EQ(runtime::cgroup_cpu_limit(root, self), 3);
  write(root + "/job/step/cpu.max", "50000 100000\n");  // half a core, below its parent's
  EXPECT_EQ(runtime::cgroup_cpu_limit(root, self), 1);
  write(root + "/job/cpu.max", "max 100000\n");
  write(root + "/job/step/cpu.max", "max 100000\n");
  EXPECT_EQ(runtime::cgroup_cpu_limit(root, self), 0) << "no quota anywhere";
  write(self, "12:cpu,cpuacct:/job\n");
  EXPECT_EQ(runtime::cgroup_cpu_limit(root, self), 0) << "cgroup v1 only";
  // This machine: the affinity mask, bounded by the real quota when there is one.
  const int64_t limit = runtime::cgroup_cpu_limit();
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  EXPECT_EQ(runtime::available_cores(), limit > 0 ? std::min<int64_t>(CPU_COUNT(&set), limit) : CPU_COUNT(&set));
}

// The project is under the Apache License 2.0 (LICENSE), and every source file says so in its
// first lines (SPDX-License-Identifier), so that a file copied out of the tree still carries it.
TEST(License, EverySourceFileCarriesTheSpdxIdentifier) {
  const std::string root = FULGUR_SOURCE_DIR;
  const std::string license = fulgur::testing::read_file(root + "/LICENSE");
  EXPECT_NE(license.find("Apache License"), std::string::npos);
  EXPECT_NE(license.find("Version 2.0, January 2004"), std::string::npos);
  const std::string tag = "SPDX-License-Identifier: Apache-2.0";
  auto is_source = [](const std::filesystem::path& p) {
    const std::string name = p.filename().string(), ext = p.extension().string();
    return ext == ".cpp" || ext == ".h" || ext == ".py" || ext == ".cmake" || ext == ".sh" || ext == ".in" ||
           name == "CMakeLists.txt" || name == "Makefile";
  };
  int checked = 0;
  std::vector<std::filesystem::path> files{root + "/CMakeLists.txt", root + "/Makefile", root + "/.ci/run"};
  for (const char* dir : {"src", "include", "tests", "examples", "tools", "bench", "fuzz", "scripts", "cmake"}) {
    for (const auto& e : std::filesystem::recursive_directory_iterator(root + "/" + dir)) {
      const std::string rel = std::filesystem::relative(e.path(), root).string();
      if (!e.is_regular_file() || rel.rfind("tests/data/", 0) == 0 || rel.rfind("fuzz/corpus/", 0) == 0) continue;
      // Scripts without an extension (scripts/install-deps, ...) are sources too.
      if (is_source(e.path()) || (rel.rfind("scripts/", 0) == 0 && e.path().extension().empty())) files.push_back(e.path());
    }
  }
  for (const auto& f : files) {
    std::ifstream in(f);
    std::string head, line;
    for (int i = 0; i < 3 && std::getline(in, line); ++i) head += line + "\n";
    EXPECT_NE(head.find(tag), std::string::npos) << f << " lacks '" << tag << "' in its first three lines";
    ++checked;
  }
  EXPECT_GT(checked, 200);
}

// The programs' command lines: --help describes every option with its default, and a usage
// error exits with 2 and names the option (CLI11's own codes were 104-109).
TEST(CommandLine, HelpDescribesEveryOptionAndUsageErrorsExitWithTwo) {
  auto run = [](const std::string& cmd, int* rc) {
    FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
    std::string out;
    char buf[4096];
    for (size_t n; p && (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
    const int status = p ? ::pclose(p) : -1;
    *rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return out;
  };
  for (const char* prog : {"mnist", "charlm"}) {
    const std::string bin = fulgur::testing::program(prog);
    int rc = 0;
    const std::string help = run(bin + " --help", &rc);
    EXPECT_EQ(rc, 0) << prog;
    std::istringstream lines(help);
    int options = 0;
    for (std::string line; std::getline(lines, line);) {
      if (line.rfind("  --", 0) != 0 || line.find("--help") != std::string::npos || line.find("--version") != std::string::npos)
        continue;
      ++options;
      // "  --name TYPE=default   description"; a long one puts the description on the next line.
      std::istringstream words(line);
      std::vector<std::string> w;
      for (std::string x; words >> x;) w.push_back(x);
      const bool valued = w.size() > 1 && w[1].find_first_of("ABCDEFGHIJKLMNOPQRSTUVWXYZ") == 0;
      EXPECT_TRUE(!valued || w[1].find('=') != std::string::npos || line.find("(unset") != std::string::npos)
          << prog << ": no default shown: " << line;
      bool described = w.size() > (valued ? 2u : 1u);
      if (!described) {
        const auto mark = lines.tellg();
        std::string next;
        described = std::getline(lines, next) && next.rfind("  -", 0) != 0 && next.find_first_not_of(' ') != std::string::npos;
        lines.seekg(mark);
      }
      EXPECT_TRUE(described) << prog << ": no description: " << line;
    }
    EXPECT_GT(options, 10) << help;
    // The environment variables that matter, each with what it does and what unset means.
    for (const char* var : {"PJRT_DEVICE", "XLA_NUM_DEVICES", "MASTER_ADDR", "OMP_NUM_THREADS"}) {
      const auto at = help.find(std::string("\n  ") + var + " ");
      ASSERT_NE(at, std::string::npos) << prog << " --help does not list " << var << ":\n" << help;
      const std::string line = help.substr(at + 1, help.find('\n', at + 1) - at - 1);
      EXPECT_NE(line.find("(unset: "), std::string::npos) << line;
    }
    const std::string bogus = run(bin + " --bogus", &rc);
    EXPECT_EQ(rc, 2) << prog << ": " << bogus;
    EXPECT_NE(bogus.find("--bogus"), std::string::npos) << bogus;
    const std::string bad = run(bin + (std::string(prog) == "mnist" ? " --max-epochs abc" : " --max-steps abc"), &rc);
    EXPECT_EQ(rc, 2) << prog << ": " << bad;
    EXPECT_NE(bad.find("abc"), std::string::npos) << bad;
  }
}
