// SPDX-License-Identifier: Apache-2.0
#include "zoo/check.h"

#include "support.h"

#include <gtest/gtest.h>

namespace fulgur::zoo {
namespace {

// Each parameter's largest difference between two models of the same structure.
std::string differences(Recording& a, Recording& b) {
  std::string out;
  const auto pa = a.named_parameters(), pb = b.named_parameters();
  for (const auto& item : pa) {
    const at::Tensor d = (item.value().detach().cpu() - pb[item.key()].detach().cpu()).abs();
    out += "\n  " + item.key() + ": " + std::to_string(d.max().item<double>());
  }
  return out;
}

}  // namespace

Run train(Recording& model, const std::string& accelerator, std::shared_ptr<TensorDataset> data,
          std::optional<double> clip, const std::string& precision) {
  fulgur::testing::TempDir dir;
  Trainer t(TrainerOptions()
                .accelerator(accelerator)
                .devices(1)
                .max_steps(20)
                .seed(11)
                .gradient_clip_val(clip)
                .precision(precision)
                .default_root_dir(dir.path)
                .enable_progress_bar(false)
                .enable_checkpointing(false)
                .logger(false)
                .num_sanity_val_steps(0));
  t.fit(model, std::make_shared<DataLoader>(data, DataLoaderOptions(8).shuffle(true)));
  std::vector<at::Tensor> flat;
  for (const auto& p : model.parameters()) flat.push_back(p.detach().cpu().reshape({-1}));
  for (const auto& b : model.buffers())
    if (b.is_floating_point()) flat.push_back(b.detach().cpu().reshape({-1}));
  return {model.recorded(), torch::cat(flat), t.callback_metrics()};
}

std::string left_xla(const xla::BackendMetrics& before, int64_t reads) {
  const xla::BackendMetrics after = xla::metrics();
  std::string out;
  for (const auto& [op, n] : after.xla_fallbacks)
    if (!before.xla_fallbacks.count(op) || before.xla_fallbacks.at(op) != n) out += " on TorchScript: " + op;
  for (const auto& [op, n] : after.eager_fallbacks) {
    const int64_t added = n - (before.eager_fallbacks.count(op) ? before.eager_fallbacks.at(op) : 0);
    if (added == 0 || (op == "aten::_local_scalar_dense" && added <= reads)) continue;
    out += " host: " + op + " x" + std::to_string(added);
  }
  return out;
}

int64_t graphs_after_warm_up(const Recording& model) {
  return model.graphs.back() - model.graphs.at(kWarmUp);
}

void check_model(const std::function<std::shared_ptr<Recording>(double)>& make, std::shared_ptr<TensorDataset> data,
                 std::optional<double> clip, double p, const std::vector<std::string>& logged) {
  const auto reads = static_cast<int64_t>(logged.size());
  torch::manual_seed(5);
  auto eager_model = make(0);
  torch::manual_seed(5);
  auto lazy_model = make(0);
  const Run eager = train(*eager_model, "cpu", data, clip);
  const xla::BackendMetrics before = xla::metrics();
  const Run lazy = train(*lazy_model, "xla", data, clip);
  EXPECT_EQ(left_xla(before, reads), "") << xla::metrics_report();
  EXPECT_GT(xla::metrics().xla_executions, before.xla_executions);
  ASSERT_EQ(lazy.losses.numel(), 20);
  EXPECT_EQ(graphs_after_warm_up(*lazy_model), 0) << xla::metrics_report();
  EXPECT_TRUE(torch::allclose(lazy.losses, eager.losses, 1e-4, 1e-5))
      << "losses: xla\n" << lazy.losses << "\neager\n" << eager.losses;
  EXPECT_TRUE(torch::allclose(lazy.parameters, eager.parameters, 1e-4, 1e-5))
      << "largest parameter difference " << (lazy.parameters - eager.parameters).abs().max().item<double>()
      << differences(*lazy_model, *eager_model);
  for (const auto& name : logged) {
    ASSERT_TRUE(eager.metrics.count(name) && lazy.metrics.count(name)) << name << " was not logged";
    EXPECT_NEAR(lazy.metrics.at(name), eager.metrics.at(name), 1e-5) << name;
  }

  torch::manual_seed(5);
  auto dropped = make(p);
  const xla::BackendMetrics before_dropout = xla::metrics();
  const Run with_dropout = train(*dropped, "xla", data, clip);
  EXPECT_EQ(left_xla(before_dropout, reads), "") << xla::metrics_report();
  ASSERT_EQ(with_dropout.losses.numel(), 20);
  EXPECT_EQ(graphs_after_warm_up(*dropped), 0) << xla::metrics_report();
  EXPECT_TRUE(with_dropout.losses.isfinite().all().item<bool>()) << with_dropout.losses;
  // The same initial weights and batches: only the dropped units make the losses differ.
  EXPECT_FALSE(torch::allclose(with_dropout.losses, lazy.losses)) << "dropout changed nothing";
}

}  // namespace fulgur::zoo
