#include "public_api.h"
#include "support.h"

#include <fulgur/accelerators/accelerator.h>
#include <fulgur/plugins/precision/precision.h>
#include <fulgur/strategies/ddp.h>
#include <fulgur/strategies/registry.h>
#include <fulgur/strategies/single_device.h>
#include <fulgur/strategies/xla.h>

#include <gtest/gtest.h>

#include <dlfcn.h>

#include <cstdio>

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
  expect_invalid([] { Trainer t(TrainerOptions().accelerator("gpu")); }, {"'gpu'", "\"cpu\"", "\"xla\""});
  expect_invalid([] { Trainer t(TrainerOptions().strategy("fsdp")); }, {"'fsdp'", "\"ddp\"", "\"xla\""});
  expect_invalid([] { Trainer t(TrainerOptions().precision("8-bit")); }, {"'8-bit'", "\"bf16-true\""});
  expect_invalid([] { Trainer t(TrainerOptions().precision("16-true")); }, {"'16-true'", "bf16-true"});
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
