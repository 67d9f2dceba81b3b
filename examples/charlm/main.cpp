// SPDX-License-Identifier: Apache-2.0
// Trains a small GPT-style character model on the King James Bible and
// prints text sampled from it.
//   build/bin/charlm --accelerator xla --devices auto --strategy xla --max-steps 600

#include "charlm_module.h"

#include <CLI/CLI.hpp>
#include <fulgur/environment.h>
#include <fulgur/version.h>

#include <cstdio>

int main(int argc, char** argv) {
  CLI::App app{"Train a character-level transformer on the King James Bible with fulgur"};
  app.option_defaults()->always_capture_default();  // --help shows each default
  std::string accelerator = "xla", devices = "auto", strategy = "xla", precision = "32-true";
  std::string root = "runs/charlm", ckpt_path, text = "data/kjv.txt", start_method = "fork";
  int64_t max_steps = 600, batch_size = 32, sample_chars = 300, val_batches = 20, max_restarts = 0, save_every = 0;
  charlm::Config cfg;
  uint64_t seed = 42;
  app.add_option("--accelerator", accelerator, "cpu, cuda, xla or auto");
  app.add_option("--devices", devices, "auto, a count, or indices like 0,1");
  app.add_option("--strategy", strategy, "auto, single_device, ddp, xla, xla_debug");
  app.add_option("--precision", precision, "32-true or bf16-true; bf16-mixed and 16-mixed on cuda");
  app.add_option("--max-steps", max_steps, "optimizer steps to train");
  app.add_option("--batch-size", batch_size, "per device");
  app.add_option("--block-size", cfg.block_size, "characters of context");
  app.add_option("--n-embd", cfg.n_embd, "embedding width");
  app.add_option("--n-head", cfg.n_head, "attention heads per block");
  app.add_option("--n-layer", cfg.n_layer, "transformer blocks");
  app.add_option("--lr", cfg.lr, "AdamW's learning rate");
  app.add_option("--val-batches", val_batches, "validation batches at the end of training");
  app.add_option("--sample-chars", sample_chars, "characters to sample after training");
  app.add_option("--seed", seed, "seed_everything and the sampler's seed");
  app.add_option("--default-root-dir", root, "where logs and checkpoints go");
  app.add_option("--ckpt-path", ckpt_path, "resume from: a file, last or best (unset: a fresh run)");
  app.add_option("--text", text, "the training text");
  app.add_option("--start-method", start_method, "fork or spawn");
  app.add_option("--max-restarts", max_restarts,
                 "start the workers again after a failure up to N times, resuming from last.ckpt (ddp, xla)");
  app.add_option("--save-every-n-steps", save_every,
                 "also write last.ckpt every N optimizer steps (0: only at the validation after max-steps)");
  app.footer("\nEnvironment (README.md lists every variable fulgur reads):\n" +
             fulgur::environment_help({"PJRT_DEVICE", "XLA_NUM_DEVICES", "FULGUR_XLA_BACKEND", "CUDA_VISIBLE_DEVICES",
                                     "NUM_NODES", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS",
                                     "FULGUR_LOG_LEVEL"}));
  app.set_version_flag("--version", "charlm (fulgur " + fulgur::version() + ")");
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
    charlm::DataModule data(text, cfg.block_size, batch_size, seed);
    cfg.vocab_size = data.text->vocab_size();
    auto model = std::make_shared<charlm::CharLM>(cfg);
    std::printf("charlm: %lld characters, vocabulary %lld, unigram entropy %.3f nats\n",
                static_cast<long long>(data.text->tokens().numel()), static_cast<long long>(cfg.vocab_size),
                data.text->unigram_entropy());
    fulgur::TrainerOptions opts;
    opts.accelerator(accelerator).devices(devices).strategy(strategy).precision(precision);
    opts.max_steps(max_steps).max_epochs(-1).default_root_dir(root).seed(seed).start_method(start_method);
    opts.val_check_interval(max_steps).limit_val_batches(val_batches).num_sanity_val_steps(0);
    opts.log_every_n_steps(20).max_restarts(max_restarts);
    // A restart resumes from last.ckpt, so it is written whenever a checkpoint is.
    if (max_restarts > 0 || save_every > 0) {
      opts.callbacks({std::make_shared<fulgur::ModelCheckpoint>(
          fulgur::ModelCheckpointOptions().save_last(true).every_n_train_steps(save_every))});
    }
    fulgur::Trainer trainer(opts);
    trainer.fit(*model, data, ckpt_path);
    const auto& m = trainer.callback_metrics();
    if (auto it = m.find("val_loss"); it != m.end()) {
      std::printf("validation loss: %.4f nats, %.2f of the unigram entropy\n", it->second,
                  it->second / data.text->unigram_entropy());
    }
    model->eval();
    auto ids = model->generate(data.text->encode("And God said").unsqueeze(0), sample_chars);
    std::printf("sample:\n%s\n", data.text->decode(ids[0]).c_str());
  } catch (const fulgur::WorkerFailure& e) {
    std::fprintf(stderr, "charlm: %s\n", e.what());
    return e.exit_code();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "charlm: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
