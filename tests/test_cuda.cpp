// SPDX-License-Identifier: Apache-2.0
// The cuda accelerator on a real GPU: one process against the CPU, two
// processes on one GPU, 16-mixed with its GradScaler, checkpoints that move
// between GPU and CPU, and batches that arrive on the device. Every test needs
// a visible CUDA device and a CUDA libtorch, and skips, saying which is
// missing, without one (CI has no GPU; scripts/device-check runs them on one).
#include "support.h"

#include <fulgur/accelerators/accelerator.h>
#include <fulgur/strategies/ddp.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>

using namespace fulgur;
using fulgur::testing::regression_data;
using fulgur::testing::TempDir;
using fulgur::testing::TinyRegression;
using ::testing::HasSubstr;

namespace {

#define REQUIRE_GPU()                                                                      \
  do {                                                                                     \
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device: " << cuda_unavailable_reason(); \
  } while (0)

TrainerOptions opts(const std::string& root) {
  return TrainerOptions()
      .default_root_dir(root)
      .enable_progress_bar(false)
      .enable_model_summary(false)
      .num_sanity_val_steps(0)
      .logger(false)
      .collective_timeout_ms(60000);
}

// Saves last.ckpt in `dir`.
std::vector<std::shared_ptr<Callback>> save_last(const std::string& dir) {
  return {std::make_shared<ModelCheckpoint>(ModelCheckpointOptions().dirpath(dir).save_last(true))};
}

std::shared_ptr<DataLoader> loader(int64_t n, int64_t batch) {
  return std::make_shared<DataLoader>(regression_data(n), DataLoaderOptions(batch).shuffle(true).seed(4));
}

at::Tensor flat_params(torch::nn::Module& m) {
  std::vector<at::Tensor> flat;
  for (auto& p : m.parameters()) flat.push_back(p.detach().to(torch::kCPU).reshape({-1}));
  return torch::cat(flat);
}

// Records where and in which dtype its steps ran, and the scaler's scale when training starts.
struct Where : TinyRegression {
  Where() : TinyRegression(0.05) {}
  StepOutput training_step(const Batch& b, int64_t i) override {
    batch_device = b.data.device();
    out_dtype = forward(b.data).scalar_type();
    return TinyRegression::training_step(b, i);
  }
  void on_train_epoch_start() override {
    if (started) return;
    started = true;
    param_device = parameters().front().device();
    if (auto* s = trainer()->strategy().precision().scaler()) start_scale = s->get_scale();
  }
  bool started = false;
  c10::Device batch_device = c10::kCPU, param_device = c10::kCPU;
  c10::ScalarType out_dtype = c10::kFloat;
  double start_scale = 0.0;
};

}  // namespace

TEST(Cuda, OneProcessTrainsOnTheGpuAsOnTheCpu) {
  REQUIRE_GPU();
  TempDir dir;
  fulgur::seed_everything(0);
  Where gpu;
  fulgur::seed_everything(0);
  Where cpu;
  Trainer tg(opts(dir.path + "/g").accelerator("cuda").devices(1).max_steps(20).enable_checkpointing(false));
  tg.fit(gpu, loader(160, 8));
  Trainer tc(opts(dir.path + "/c").accelerator("cpu").devices(1).max_steps(20).enable_checkpointing(false));
  tc.fit(cpu, loader(160, 8));
  EXPECT_EQ(gpu.batch_device, c10::Device(c10::kCUDA, 0));
  EXPECT_EQ(gpu.param_device, c10::Device(c10::kCUDA, 0));
  EXPECT_TRUE(gpu.parameters().front().device().is_cpu()) << "the module comes back to the CPU after fit";
  ASSERT_EQ(gpu.losses.size(), 20u);
  for (size_t i = 0; i < 20; ++i) EXPECT_NEAR(gpu.losses[i], cpu.losses[i], 1e-4 * (1 + std::abs(cpu.losses[i]))) << i;
  EXPECT_TRUE(torch::allclose(flat_params(gpu), flat_params(cpu), 1e-4, 1e-5)) << flat_params(gpu) << flat_params(cpu);
}

// One GPU cannot hold two NCCL ranks; two processes share it here over Gloo, whose
// collectives fulgur stages through the CPU.
TEST(Cuda, TwoProcessesOnOneGpuMatchOneProcessWithTwiceTheBatch) {
  REQUIRE_GPU();
  TempDir dir;
  fulgur::seed_everything(0);
  TinyRegression two;
  fulgur::seed_everything(0);
  TinyRegression one;
  auto acc = std::make_shared<CUDAAccelerator>();
  auto ddp = std::make_shared<DDPStrategy>(acc, std::vector<int64_t>{0, 0}, nullptr, nullptr,
                                           ParallelOptions().timeout(std::chrono::milliseconds(60000)));
  Trainer t2(opts(dir.path).strategy(ddp).max_epochs(2).enable_checkpointing(false));
  t2.fit(two, loader(64, 4));
  Trainer t1(opts(dir.path).accelerator("cuda").devices(1).max_epochs(2).enable_checkpointing(false));
  t1.fit(one, loader(64, 8));
  EXPECT_EQ(t2.global_step(), 16);
  EXPECT_TRUE(torch::allclose(flat_params(two), flat_params(one), 1e-5, 1e-6)) << flat_params(two) << flat_params(one);
}

// seed_everything leaves CUDA alone in the launching process, so forked workers can start it
// (the test above); a process that started CUDA itself gets a worker error that says why.
TEST(Cuda, WorkersForkedAfterTheParentStartedCudaSayWhyTheyCannotUseIt) {
  REQUIRE_GPU();
  TempDir dir;
  torch::manual_seed(0);  // starts CUDA in this process, as torch.cuda.manual_seed_all would not
  TinyRegression model;
  auto ddp = std::make_shared<DDPStrategy>(std::make_shared<CUDAAccelerator>(), std::vector<int64_t>{0, 0}, nullptr,
                                           nullptr, ParallelOptions().timeout(std::chrono::milliseconds(60000)));
  Trainer t(opts(dir.path).strategy(ddp).max_epochs(1).enable_checkpointing(false));
  try {
    t.fit(model, loader(16, 4));
    FAIL() << "forked workers used a CUDA the parent had started";
  } catch (const std::exception& e) {
    EXPECT_THAT(e.what(), HasSubstr("the launching process had already started CUDA"));
    EXPECT_THAT(e.what(), HasSubstr("start_method(\"spawn\")"));
  }
}

TEST(Cuda, SixteenMixedRunsInFloat16AndResumesItsScalerFromTheCheckpoint) {
  REQUIRE_GPU();
  TempDir dir;
  fulgur::seed_everything(0);
  Where first;
  Trainer t1(opts(dir.path).accelerator("cuda").devices(1).precision("16-mixed").max_epochs(2)
                 .callbacks(save_last(dir.path + "/checkpoints")));
  t1.fit(first, loader(64, 8));
  EXPECT_EQ(first.out_dtype, c10::kHalf) << "the forward ran outside float16 autocast";
  EXPECT_EQ(first.param_device.type(), c10::kCUDA);
  EXPECT_DOUBLE_EQ(first.start_scale, 65536.0);
  EXPECT_LT(first.losses.back(), first.losses.front());
  const std::string last = dir.path + "/checkpoints/last.ckpt";
  ASSERT_TRUE(std::filesystem::exists(last)) << last;
  const Checkpoint ckpt = TorchCheckpointIO().load_checkpoint(last);
  ASSERT_TRUE(ckpt.contains("MixedPrecision"));
  const auto state = ckpt.at("MixedPrecision").toGenericDict();
  const double saved = state.at("scale").toDouble();
  EXPECT_GT(saved, 0.0);
  EXPECT_DOUBLE_EQ(saved, t1.strategy().precision().scaler()->get_scale());
  fulgur::seed_everything(0);
  Where resumed;
  Trainer t2(opts(dir.path).accelerator("cuda").devices(1).precision("16-mixed").max_epochs(3));
  t2.fit(resumed, loader(64, 8), nullptr, last);
  EXPECT_DOUBLE_EQ(resumed.start_scale, saved) << "the resumed run started from a fresh scale";
  EXPECT_EQ(t2.current_epoch(), 3);
}

// A checkpoint written on the GPU resumes on the CPU, and one written on the CPU on the GPU.
TEST(Cuda, ACheckpointMovesBetweenTheGpuAndTheCpu) {
  REQUIRE_GPU();
  for (const auto& [from, to] : {std::pair<std::string, std::string>{"cuda", "cpu"}, {"cpu", "cuda"}}) {
    TempDir dir;
    fulgur::seed_everything(0);
    TinyRegression straight;
    Trainer ts(opts(dir.path + "/s").accelerator(from).devices(1).max_epochs(3).enable_checkpointing(false));
    ts.fit(straight, loader(64, 8));
    fulgur::seed_everything(0);
    TinyRegression a;
    Trainer ta(opts(dir.path + "/a").accelerator(from).devices(1).max_epochs(2)
                   .callbacks(save_last(dir.path + "/a/checkpoints")));
    ta.fit(a, loader(64, 8));
    fulgur::seed_everything(1);  // other initial weights: the checkpoint must bring them
    TinyRegression b;
    Trainer tb(opts(dir.path + "/b").accelerator(to).devices(1).max_epochs(3));
    tb.fit(b, loader(64, 8), nullptr, dir.path + "/a/checkpoints/last.ckpt");
    EXPECT_EQ(tb.current_epoch(), 3) << from << " -> " << to;
    EXPECT_TRUE(torch::allclose(flat_params(b), flat_params(straight), 1e-5, 1e-6))
        << from << " -> " << to << "\n" << flat_params(b) << flat_params(straight);
  }
}
