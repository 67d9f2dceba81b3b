// SPDX-License-Identifier: Apache-2.0
// Trains an MNIST classifier (the CNN by default) and prints its test accuracy.
//   build/bin/mnist --data-dir data/mnist --accelerator xla --devices auto --strategy xla --max-epochs 1
// Across machines, see docs/MULTI_NODE.md.

#include "mnist_module.h"

#include <CLI/CLI.hpp>
#include <fulgur/environment.h>
#include <fulgur/version.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>

namespace {

// Writes each rank's final parameters to <dir>/rank-<global rank>.pt
// (torch::save of the parameter list, in order), at the end of fit.
struct SaveWeights : fulgur::Callback {
  explicit SaveWeights(std::string dir) : dir(std::move(dir)) {}
  std::string state_key() const override { return "SaveWeights"; }
  void on_fit_end(fulgur::Trainer& trainer, fulgur::LightningModule& module) override {
    std::vector<torch::Tensor> params;
    for (const auto& p : module.parameters()) params.push_back(p.detach().to(torch::kCPU));
    std::filesystem::create_directories(dir);
    torch::save(params, dir + "/rank-" + std::to_string(trainer.global_rank()) + ".pt");
  }
  std::string dir;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Train a small CNN on MNIST with fulgur"};
  app.option_defaults()->always_capture_default();  // --help shows each default
  std::string model_name = "cnn", accelerator = "auto", devices = "1", strategy = "auto", precision = "32-true";
  std::string root = "runs/mnist", ckpt_path, data_dir = "data/mnist", start_method = "fork", save_weights;
  std::string comm_hook = "none";
  int64_t max_epochs = 1, max_steps = -1, batch_size = 64, train_limit = 0, num_nodes = 1, timeout_s = 1800;
  int64_t max_restarts = 0, save_every = 0;
  double limit_train = 1.0, lr = 1e-3;
  uint64_t seed = 42;
  bool no_test = false;
  app.add_option("--model", model_name, "cnn or mlp");
  app.add_option("--accelerator", accelerator, "cpu, cuda, xla or auto");
  app.add_option("--devices", devices, "auto, a count, or indices like 0,1");
  app.add_option("--strategy", strategy, "auto, single_device, ddp, xla, xla_debug");
  app.add_option("--precision", precision, "32-true, bf16-true, bf16-mixed (cpu, cuda) or 16-mixed (cuda)");
  app.add_option("--ddp-comm-hook", comm_hook,
                 "none, or bf16_compress_hook: gradients all-reduced in bfloat16 (half the bytes) and averaged in "
                 "float32 (strategies ddp and xla on several devices)");
  if (const char* nodes = std::getenv("NUM_NODES"); nodes && *nodes) num_nodes = std::atoll(nodes);
  app.add_option("--num-nodes", num_nodes, "machines in the job (default: $NUM_NODES, else 1)");
  app.add_option("--max-epochs", max_epochs, "epochs to train (-1: no limit)");
  app.add_option("--max-steps", max_steps, "optimizer steps to train (-1: no limit)");
  app.add_option("--limit-train-batches", limit_train, "fraction (<=1.0) or count (>1) of batches per epoch");
  app.add_option("--train-samples", train_limit, "use only the first N training images (0: all 55,000)");
  app.add_option("--batch-size", batch_size, "per device");
  app.add_option("--lr", lr, "Adam's learning rate");
  app.add_option("--seed", seed, "seed_everything and the sampler's seed");
  app.add_option("--default-root-dir", root, "where logs and checkpoints go");
  app.add_option("--ckpt-path", ckpt_path, "resume from: a file, last or best (unset: a fresh run)");
  app.add_option("--data-dir", data_dir, "the MNIST idx files");
  app.add_option("--start-method", start_method, "fork or spawn");
  app.add_option("--collective-timeout", timeout_s, "seconds a collective or the rendezvous may wait")
      ->check(CLI::PositiveNumber);
  app.add_option("--max-restarts", max_restarts,
                 "start the workers again after a failure up to N times, resuming from last.ckpt (ddp, xla)");
  app.add_option("--save-every-n-steps", save_every, "also write last.ckpt every N optimizer steps (0: at epoch end)");
  app.add_option("--save-weights", save_weights, "folder: each rank writes its final parameters to rank-<R>.pt (unset: none written)");
  app.add_flag("--no-test", no_test, "skip the test run after fit");
  app.footer("\nEnvironment (README.md lists every variable fulgur reads):\n" +
             fulgur::environment_help({"PJRT_DEVICE", "XLA_NUM_DEVICES", "FULGUR_XLA_BACKEND", "CUDA_VISIBLE_DEVICES",
                                     "NUM_NODES", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS",
                                     "FULGUR_LOG_LEVEL"}));
  app.set_version_flag("--version", "mnist (fulgur " + fulgur::version() + ")");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version exit 0; a usage error prints CLI11's message (it names the option)
    // and exits 2, as argparse and getopt programs do.
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }

  try {
    fulgur::seed_everything(seed);
    auto model = mnist::make_model(model_name, lr);
    mnist::DataModule data(data_dir, batch_size, seed, train_limit);
    fulgur::TrainerOptions opts;
    opts.accelerator(accelerator).devices(devices).strategy(strategy).precision(precision).num_nodes(num_nodes);
    opts.max_epochs(max_epochs).max_steps(max_steps).default_root_dir(root).seed(seed).start_method(start_method);
    opts.log_every_n_steps(20).collective_timeout_ms(timeout_s * 1000).max_restarts(max_restarts);
    if (const auto hook = fulgur::parse_ddp_comm_hook(comm_hook); hook != fulgur::DDPCommHook::kNone) {
      // A comm hook lives on the strategy object, which then carries every option above.
      opts.strategy(fulgur::make_strategy(fulgur::StrategyRequest()
                                              .strategy(strategy)
                                              .accelerator(accelerator)
                                              .devices(devices)
                                              .precision(precision)
                                              .num_nodes(num_nodes)
                                              .start_method(start_method)
                                              .max_restarts(max_restarts)
                                              .collective_timeout(std::chrono::seconds(timeout_s))
                                              .ddp_comm_hook(hook)));
    }
    std::vector<std::shared_ptr<fulgur::Callback>> callbacks;
    if (!save_weights.empty()) callbacks.push_back(std::make_shared<SaveWeights>(save_weights));
    // A restart resumes from last.ckpt, so it is written whenever a checkpoint is.
    if (max_restarts > 0 || save_every > 0) {
      callbacks.push_back(std::make_shared<fulgur::ModelCheckpoint>(
          fulgur::ModelCheckpointOptions().save_last(true).every_n_train_steps(save_every)));
    }
    opts.callbacks(callbacks);
    if (limit_train > 1.0) {
      opts.limit_train_batches(static_cast<int64_t>(limit_train));
    } else {
      opts.limit_train_batches(limit_train);
    }
    fulgur::Trainer trainer(opts);
    trainer.fit(*model, data, ckpt_path);
    if (!no_test) {
      // Rank 0's results come back to node 0 only.
      auto metrics = trainer.test(*model, data);
      if (metrics.count("test_acc")) std::printf("test accuracy: %.4f (loss %.4f)\n", metrics["test_acc"], metrics["test_loss"]);
    }
    if (auto* ckpt = trainer.checkpoint_callback(); ckpt && !ckpt->best_model_path().empty()) {
      std::printf("checkpoint: %s\n", ckpt->best_model_path().c_str());
    }
  } catch (const fulgur::WorkerFailure& e) {
    std::fprintf(stderr, "mnist: %s\n", e.what());
    return e.exit_code();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mnist: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
