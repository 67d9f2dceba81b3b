// SPDX-License-Identifier: Apache-2.0
// What a LightningModule offers a user's steps, as Lightning's does: all_gather, print on rank 0,
// log_dict with a prefix, and where the process stands (global_rank, local_rank, world_size).
#include "support.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <stdexcept>

using namespace fulgur;
using fulgur::testing::TempDir;
using fulgur::testing::TinyRegression;
using ::testing::HasSubstr;

namespace {

void check(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error("in the worker: " + what);
}

struct Api : TinyRegression {
  StepOutput training_step(const Batch& b, int64_t i) override {
    auto out = TinyRegression::training_step(b, i);
    log_dict({{"a", torch::tensor(1.0)}, {"b", torch::tensor(2.0)}}, LogOptions(), "val/");
    log_dict(std::map<std::string, double>{{"c", 3.0}}, LogOptions(), "train/");
    return out;
  }
  void on_fit_start() override {
    const int64_t n = world_size(), r = global_rank();
    check(n == trainer()->world_size() && r == trainer()->global_rank() && local_rank() == r, "rank accessors");
    at::Tensor g = all_gather(torch::full({2}, static_cast<double>(r)));
    if (n == 1) {
      check(g.sizes() == c10::IntArrayRef({2}), "one process: all_gather returns its input");
    } else {
      check(g.sizes() == c10::IntArrayRef({n, 2}) && g[1][0].item<double>() == 1.0, "all_gather stacks the ranks");
    }
    print("printed by rank " + std::to_string(r) + " of " + std::to_string(n));
  }
};

}  // namespace

TEST(ModuleApi, AllGatherPrintLogDictAndRanksOnOneAndTwoProcesses) {
  for (const int devices : {2, 1}) {  // forked workers first (see Strategy::backward on CUDA libtorches)
    TempDir dir;
    Api m;
    EXPECT_EQ(m.world_size(), 1);
    EXPECT_EQ(m.all_gather(torch::ones({3})).sizes(), c10::IntArrayRef({3})) << "outside a run: the input";
    ::testing::internal::CaptureStdout();
    Trainer t(TrainerOptions().accelerator("cpu").strategy(devices > 1 ? "ddp" : "auto").devices(devices).max_epochs(1)
                  .default_root_dir(dir.path).logger(false).enable_progress_bar(false).enable_model_summary(false)
                  .enable_checkpointing(false).collective_timeout_ms(20000));
    t.fit(m, std::make_shared<DataLoader>(fulgur::testing::regression_data(16), DataLoaderOptions(4)));
    const std::string out = ::testing::internal::GetCapturedStdout();
    EXPECT_THAT(out, HasSubstr("printed by rank 0 of " + std::to_string(devices) + "\n")) << devices;
    EXPECT_THAT(out, ::testing::Not(HasSubstr("printed by rank 1"))) << "print is rank 0's";
    EXPECT_DOUBLE_EQ(t.callback_metrics().at("val/a"), 1.0);
    EXPECT_DOUBLE_EQ(t.callback_metrics().at("val/b"), 2.0);
    EXPECT_DOUBLE_EQ(t.callback_metrics().at("train/c"), 3.0);
  }
}
