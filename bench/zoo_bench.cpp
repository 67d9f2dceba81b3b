// SPDX-License-Identifier: Apache-2.0
// The model zoo (tests/zoo/) on xla against eager, in one process: each model fitted with the
// Trainer on cpu and then on xla (the configuration tests/test_zoo*.cpp compare: dropout off),
// from the same initial weights and batches. Prints one tab-separated row per model:
//
//   model  eager step ms  xla step ms  xla graphs  xla compile s  PJRT compiles  cache hits
//
// Each fit is the zoo's 20 steps (the GPT's OneCycleLR is laid out over 20). A step's time is the
// median interval between two steps' losses after the warm-up steps (zoo::kWarmUp + 1 on),
// tracing, compiling and running included; the compile figures are the xla fit's (StableHLO
// emission and PJRT compile, or compile cache load: BackendMetrics::xla_compile_seconds).
// bench/zoo_bench.py runs it twice on one compile cache and makes the table.
//
//   zoo_bench [model ...]     (models: all of them when none is named)

#include "zoo/gpt.h"
#include "zoo/models.h"

#include "xla/pjrt/metrics.h"

#include <fulgur/fulgur.h>
#include <fulgur/xla/backend.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include <unistd.h>

using namespace fulgur;
using namespace fulgur::zoo;

namespace {

struct Entry {
  std::function<std::shared_ptr<Recording>()> make;  // dropout off
  std::function<std::shared_ptr<TensorDataset>()> data;
  std::optional<double> clip;
};

// The zoo as tests/test_zoo.cpp and tests/test_zoo_gpt.cpp train it.
const std::map<std::string, Entry>& entries() {
  static const std::map<std::string, Entry> entries{
      {"mlp", {[] { return std::make_shared<Mlp>(0); }, [] { return regression_data(160); }, 0.5}},
      {"cnn", {[] { return std::make_shared<ResidualCnn>(0); }, image_data, std::nullopt}},
      {"transformer", {[] { return std::make_shared<TinyTransformer>(0); }, token_data, 1.0}},
      {"robust", {[] { return std::make_shared<RobustRegression>(0); }, [] { return regression_data(160); }, 1.0}},
      {"lstm", {[] { return std::make_shared<SequenceRegressor>(0); }, sequence_data, 1.0}},
      {"vae", {[] { return std::make_shared<Vae>(0); }, vae_data, 5.0}},
      {"unet", {[] { return std::make_shared<TinyUNet>(0); }, denoising_data, 1.0}},
      {"gpt", {[] { return std::make_shared<TinyGpt>(0); }, counting_data, 1.0}},
  };
  return entries;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// The median step interval of a 20-step fit on `accelerator`, in milliseconds.
double fit_ms(Recording& model, const std::string& accelerator, const Entry& e) {
  const std::string root = (std::filesystem::temp_directory_path() / ("zoo_bench_" + std::to_string(::getpid()))).string();
  Trainer t(TrainerOptions()
                .accelerator(accelerator)
                .devices(1)
                .max_steps(20)
                .seed(11)
                .gradient_clip_val(e.clip)
                .default_root_dir(root)
                .enable_progress_bar(false)
                .enable_checkpointing(false)
                .logger(false)
                .num_sanity_val_steps(0));
  t.fit(model, std::make_shared<DataLoader>(e.data(), DataLoaderOptions(8).shuffle(true)));
  std::filesystem::remove_all(root);
  std::vector<double> intervals;
  for (size_t i = kWarmUp + 1; i < model.times.size(); ++i) intervals.push_back(model.times[i] - model.times[i - 1]);
  return 1e3 * median(intervals);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> names;
  for (int i = 1; i < argc; ++i) {
    if (!entries().count(argv[i])) {
      std::cerr << "zoo_bench: unknown model '" << argv[i] << "'; usage: zoo_bench [model ...], models:";
      for (const auto& [name, e] : entries()) std::cerr << " " << name;
      std::cerr << "\n";
      return 2;
    }
    names.push_back(argv[i]);
  }
  if (names.empty())
    for (const auto& [name, e] : entries()) names.push_back(name);
  for (const auto& name : names) {
    const Entry& e = entries().at(name);
    torch::manual_seed(5);
    auto eager_model = e.make();
    torch::manual_seed(5);
    auto lazy_model = e.make();
    const double eager_ms = fit_ms(*eager_model, "cpu", e);
    const xla::BackendMetrics before = xla::metrics();
    const xla::pjrt::RuntimeMetrics runtime_before = xla::pjrt::runtime_metrics();
    const double xla_ms = fit_ms(*lazy_model, "xla", e);
    const xla::BackendMetrics after = xla::metrics();
    const xla::pjrt::RuntimeMetrics runtime_after = xla::pjrt::runtime_metrics();
    std::printf("%s\t%.4f\t%.4f\t%lld\t%.4f\t%lld\t%lld\n", name.c_str(), eager_ms, xla_ms,
                static_cast<long long>(after.xla_graphs_compiled - before.xla_graphs_compiled),
                after.xla_compile_seconds - before.xla_compile_seconds,
                static_cast<long long>(runtime_after.programs_compiled - runtime_before.programs_compiled),
                static_cast<long long>(runtime_after.cache_hits - runtime_before.cache_hits));
    std::fflush(stdout);
  }
  return 0;
}
