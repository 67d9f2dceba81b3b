// SPDX-License-Identifier: Apache-2.0
// Trains one of the example models with fulgur's Trainer from given initial
// weights and writes what bench/run.py compares with the Python references:
// samples/s over the timed steps (after the warm-up steps), the loss of the
// last step, graphs compiled, gradient-sync time, a raw all-reduce of the
// gradient bytes and peak resident memory, one JSON file per rank.
//   build/bin/fulgur_bench --model cnn --accelerator cpu --devices 2 --init cnn.pt --out /tmp/r

#include "charlm/charlm_module.h"
#include "mnist/mnist_module.h"

#include <fulgur/checkpoint.h>
#include <fulgur/data/data_loader.h>
#include <fulgur/launchers/launcher.h>
#include <fulgur/lightning_module.h>
#include <fulgur/strategies/ddp.h>
#include <fulgur/strategies/registry.h>
#include <fulgur/xla/backend.h>

#include "distributed/gradient_sync.h"

#include <CLI/CLI.hpp>

#include <dlfcn.h>
#include <sys/resource.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iomanip>
#include <stdexcept>
#include <sstream>
#include <string>

namespace {

using Clock = std::chrono::steady_clock;

struct Settings {
  std::string model = "mlp", accelerator = "cpu", data_dir = "data", init_dir, out;
  int64_t devices = 1, threads = 0, batch_size = 0, warmup = 10, steps = 100, num_workers = 0, train_samples = 0;
  int64_t fail_rank = -1, fail_step = 3;
  uint64_t seed = 0;
  bool raw_allreduce = false;
  std::string ddp_comm_hook = "none";
  bool handle_signals = true;
};

// A memory field of /proc/self/status ("VmHWM:", "VmRSS:") in MiB.
double status_mb(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field, 0) == 0) return std::stod(line.substr(std::string(field).size())) / 1024.0;
  }
  return 0.0;
}

void set_threads(int n) {
  at::set_num_threads(n);
  using SetThreads = void (*)(int);
  if (auto fn = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) fn(n);
}

// Times steps [warmup, warmup + steps) at step boundaries, after the step's
// work is done (on xla devices, after a step mark), and writes the result.
class BenchCallback : public fulgur::Callback {
 public:
  explicit BenchCallback(Settings s) : s_(std::move(s)) {}
  std::string state_key() const override { return "BenchCallback"; }

  void on_fit_start(fulgur::Trainer&, fulgur::LightningModule&) override {
    if (s_.threads > 0) set_threads(static_cast<int>(s_.threads));
    if (s_.accelerator == "xla") graphs_before_ = fulgur::xla::metrics().graphs_compiled;
  }

  void on_train_batch_end(fulgur::Trainer& trainer, fulgur::LightningModule&, const fulgur::StepOutput& out,
                          const fulgur::Batch&, int64_t) override {
    const int64_t step = trainer.global_step();
    if (step == 1) {
      // Wall-clock time at the end of the first step, work done: the driver
      // subtracts the time it started this program (start-up to first step).
      sync(out);
      first_step_unix_ = unix_seconds();
    }
    if (trainer.global_rank() == s_.fail_rank && step == s_.fail_step) {
      // The message names neither the rank nor the program: the fault table checks whether the
      // framework's own report does. The time of the fault goes to <out>.fault_unix first.
      std::ofstream(s_.out + ".fault_unix") << std::fixed << std::setprecision(6) << unix_seconds() << "\n";
      throw std::runtime_error("injected fault at step " + std::to_string(s_.fail_step));
    }
    if (step == s_.warmup) {
      sync(out);
      start_ = Clock::now();
      sync_start_ = sync_seconds(trainer);
      execute_start_ = execute_seconds();
      cpu_start_ = cpu_seconds();
      if (s_.accelerator == "xla") metrics_start_ = fulgur::xla::metrics();
    }
    if (step == s_.warmup + s_.steps) {
      final_loss_ = sync(out);
      seconds_ = std::chrono::duration<double>(Clock::now() - start_).count();
      sync_total_ = sync_seconds(trainer) - sync_start_;
      execute_total_ = execute_seconds() - execute_start_;
      cpu_total_ = cpu_seconds() - cpu_start_;
      if (s_.accelerator == "xla") metrics_end_ = fulgur::xla::metrics();
    }
  }

  void on_train_epoch_end(fulgur::Trainer&, fulgur::LightningModule&) override {
    rss_by_epoch_.push_back(status_mb("VmRSS:"));
  }

  void on_fit_end(fulgur::Trainer& trainer, fulgur::LightningModule& model) override {
    const int64_t world = trainer.world_size();
    std::ostringstream js;
    js.precision(10);
    const std::string side = s_.accelerator == "xla" ? "xla" : s_.accelerator == "cuda" ? "cuda" : "ddp";
    js << "{\"side\": \"fulgur_" << side << "\", \"model\": \"" << s_.model
       << "\", \"rank\": " << trainer.global_rank() << ", \"world_size\": " << world
       << ", \"threads\": " << at::get_num_threads() << ", \"steps\": " << s_.steps << ", \"warmup\": " << s_.warmup
       << ", \"batch_size\": " << s_.batch_size << ", \"seconds\": " << seconds_
       << ", \"samples_per_s\": " << static_cast<double>(s_.batch_size * world * s_.steps) / seconds_
       << ", \"step_seconds\": " << seconds_ / static_cast<double>(s_.steps) << ", \"final_loss\": " << final_loss_
       << ", \"sync_seconds_per_step\": " << sync_total_ / static_cast<double>(s_.steps)
       << ", \"cpu_seconds_per_step\": " << cpu_total_ / static_cast<double>(s_.steps)
       << ", \"peak_rss_mb\": " << status_mb("VmHWM:") << ", \"first_step_unix\": " << std::fixed << std::setprecision(6) << first_step_unix_
       << std::defaultfloat << std::setprecision(10)
       << ", \"rss_mb_by_epoch\": [";
    for (size_t i = 0; i < rss_by_epoch_.size(); ++i) js << (i ? ", " : "") << rss_by_epoch_[i];
    js << "]";
    if (s_.accelerator == "xla") {
      js << ", \"xla_backend\": \"" << fulgur::xla::backend().name() << "\"";
      const auto m = fulgur::xla::metrics();
      // Compile figures of the whole process (this fit's graphs: one fit per process for xla).
      js << ", \"graphs_compiled\": " << m.graphs_compiled - graphs_before_
         << ", \"graph_execute_seconds_per_step\": " << execute_total_ / static_cast<double>(s_.steps)
         << ", \"compile_step_seconds\": " << m.compile_seconds << ", \"xla_graphs_compiled\": " << m.xla_graphs_compiled
         << ", \"xla_compile_seconds\": " << m.xla_compile_seconds;
      // Per timed step: step marks, PJRT executions, bytes moved (what a step costs beyond compute).
      const double n = static_cast<double>(s_.steps);
      js << ", \"mark_steps_per_step\": " << (metrics_end_.mark_steps - metrics_start_.mark_steps) / n
         << ", \"xla_executions_per_step\": " << (metrics_end_.xla_executions - metrics_start_.xla_executions) / n
         << ", \"bytes_to_device_per_step\": " << (metrics_end_.bytes_to_device - metrics_start_.bytes_to_device) / n
         << ", \"bytes_to_host_per_step\": " << (metrics_end_.bytes_to_host - metrics_start_.bytes_to_host) / n;
    }
    if (s_.raw_allreduce && world > 1) communication(trainer, model, js);
    js << "}";
    std::ofstream f(s_.out + "_" + s_.model + "." + std::to_string(trainer.global_rank()) + ".json");
    f << js.str() << "\n";
  }

 private:
  double sync(const fulgur::StepOutput& out) {
    if (s_.accelerator == "xla") fulgur::xla::mark_step();
    return out.loss().item<double>();
  }

  // CPU time of the whole process (every thread, user + system): on a loaded machine it moves
  // less than wall time, though it counts the time the plugin's threads spin for work as well.
  static double cpu_seconds() {
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
           1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
  }

  static double unix_seconds() {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  }

  // Time spent in step marks that found their graph compiled (running it).
  double execute_seconds() const {
    return s_.accelerator == "xla" ? fulgur::xla::metrics().execute_seconds : 0.0;
  }

  static double sync_seconds(fulgur::Trainer& trainer) {
    auto* ddp = dynamic_cast<fulgur::DDPStrategy*>(&trainer.strategy());
    return ddp ? ddp->gradient_sync_seconds() : 0.0;
  }

  // Communication, with the ranks aligned by a barrier before each timing so
  // that the wait for a slower rank's backward (which the in-step figure
  // counts) is left out. Interleaved, 60 times each, medians:
  //  - one Gloo all-reduce of as many bytes as the gradients, on the trainer's
  //    own process group (the loopback limit);
  //  - the same bytes cut as DDPStrategy's bucket reducer cuts them (make_buckets,
  //    the reducer's default sizes): every bucket's all-reduce started, then all
  //    waited for, with no copy; and the last bucket's alone (it holds the first
  //    layers' gradients, which backward produces last, so no overlap can hide
  //    it). With the CPU time this process spent in them (Gloo's threads
  //    included): on loopback, moving bytes is CPU work that overlap cannot
  //    take off a saturated machine. bench/run.py's limit rows use these;
  //  - on cpu devices, one gradient sync by DDPStrategy's component (the
  //    bucket reducer, same bucket sizes): copies into buckets, the bucket
  //    all-reduces, the division and the copies back.
  void communication(fulgur::Trainer& trainer, fulgur::LightningModule& model, std::ostringstream& js) const {
    auto* ps = dynamic_cast<fulgur::ParallelStrategy*>(&trainer.strategy());
    if (!ps || !ps->collectives()) return;
    auto params = fulgur::detail::unique_trainable_parameters(model);
    int64_t n = 0;
    for (auto& p : params) {
      n += p.numel();
      if (!p.grad().defined()) p.mutable_grad() = torch::ones_like(p);
    }
    at::Tensor buf = torch::zeros({n});
    const fulgur::detail::BucketOptions sizes;
    auto buckets = fulgur::detail::make_buckets(params, sizes.first_bucket_bytes, sizes.bucket_bytes);
    fulgur::detail::BucketOptions reducer_options;
    reducer_options.comm_hook = ps->parallel_options().ddp_comm_hook();
    auto reducer =
        s_.accelerator == "cpu" ? fulgur::detail::make_bucket_reducer(params, ps->collectives(), reducer_options) : nullptr;
    auto& c = *ps->collectives();
    std::vector<double> raw, bucketed, bucketed_cpu, last, sync;
    auto timed = [&](std::vector<double>& into, const std::function<void()>& fn, std::vector<double>* cpu = nullptr) {
      c.barrier("communication");
      const double cpu0 = cpu_seconds();
      const auto t0 = Clock::now();
      fn();
      into.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
      if (cpu) cpu->push_back(cpu_seconds() - cpu0);
    };
    for (int i = 0; i < 60; ++i) {
      timed(raw, [&] { c.all_reduce_async(buf, fulgur::ReduceOp::kSum)->wait(); });
      timed(bucketed, [&] {
        std::vector<std::unique_ptr<fulgur::PendingReduce>> pending;
        for (auto& b : buckets) pending.push_back(c.all_reduce_async(b.flat, fulgur::ReduceOp::kSum));
        for (auto& p : pending) p->wait();
      }, &bucketed_cpu);
      timed(last, [&] { c.all_reduce_async(buckets.back().flat, fulgur::ReduceOp::kSum)->wait(); });
      if (reducer) timed(sync, [&] { reducer->finalize(); });
    }
    auto median = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    js << ", \"raw_allreduce_seconds\": " << median(raw) << ", \"grad_bytes\": " << n * 4
       << ", \"buckets\": " << buckets.size() << ", \"raw_bucketed_allreduce_seconds\": " << median(bucketed)
       << ", \"raw_bucketed_allreduce_cpu_seconds\": " << median(bucketed_cpu)
       << ", \"raw_last_bucket_allreduce_seconds\": " << median(last);
    if (reducer) js << ", \"aligned_sync_seconds\": " << median(sync);
  }

  Settings s_;
  Clock::time_point start_;
  std::vector<double> rss_by_epoch_;
  int64_t graphs_before_ = 0;
  fulgur::xla::BackendMetrics metrics_start_, metrics_end_;  // at the first and last timed step
  double seconds_ = 0.0, final_loss_ = 0.0, sync_start_ = 0.0, sync_total_ = 0.0;
  double cpu_start_ = 0.0, cpu_total_ = 0.0;
  double execute_start_ = 0.0, execute_total_ = 0.0, first_step_unix_ = 0.0;
};

std::shared_ptr<fulgur::Dataset> train_dataset(const Settings& s, int64_t* vocab_size) {
  if (s.model == "charlm") {
    charlm::Config cfg;
    auto text = fulgur::CharDataset::from_file(s.data_dir + "/kjv.txt", cfg.block_size);
    *vocab_size = text->vocab_size();
    return std::make_shared<fulgur::SubsetDataset>(text, 0, text->size() * 9 / 10);
  }
  auto full = fulgur::load_mnist(s.data_dir + "/mnist", fulgur::Split::kTrain);
  const int64_t n = s.train_samples > 0 ? std::min<int64_t>(s.train_samples, 55000) : 55000;
  return std::make_shared<fulgur::SubsetDataset>(full, 0, n);
}

// Loads a plain dict of tensors saved by Python's torch.save (reference.py
// saves dict(model.state_dict())) through fulgur's checked reader.
void load_initial_weights(torch::nn::Module& module, const std::string& path) {
  fulgur::load_from_checkpoint(module, path, true);
}

// One fit of `s.model` from its initial weights; the callback writes the result.
void run(Settings s) {
  int64_t vocab = 0;
  auto dataset = train_dataset(s, &vocab);
  std::shared_ptr<fulgur::LightningModule> model;
  if (s.model == "charlm") {
    charlm::Config cfg;
    cfg.vocab_size = vocab;
    model = std::make_shared<charlm::CharLM>(cfg);
  } else {
    model = mnist::make_model(s.model, 1e-3);
  }
  load_initial_weights(*model, s.init_dir + "/" + s.model + ".pt");
  if (s.batch_size <= 0) s.batch_size = s.model == "charlm" ? 32 : 64;
  auto loader = std::make_shared<fulgur::DataLoader>(
      dataset,
      fulgur::DataLoaderOptions(s.batch_size).shuffle(true).seed(s.seed).drop_last(true).num_workers(s.num_workers));

  fulgur::TrainerOptions opts;
  const bool xla = s.accelerator == "xla";
  // One cuda device: SingleDeviceStrategy, as Lightning picks for devices=1 on a GPU.
  const std::string strategy = xla ? (s.devices > 1 ? "xla" : "single_xla")
                                   : (s.accelerator == "cuda" && s.devices == 1 ? "single_device" : "ddp");
  opts.accelerator(s.accelerator).devices(s.devices).strategy(strategy);
  if (const auto hook = fulgur::parse_ddp_comm_hook(s.ddp_comm_hook); hook != fulgur::DDPCommHook::kNone) {
    opts.strategy(fulgur::make_strategy(
        fulgur::StrategyRequest().strategy(strategy).accelerator(s.accelerator).devices(std::to_string(s.devices)).ddp_comm_hook(hook)));
  }
  opts.max_steps(s.warmup + s.steps).max_epochs(-1).num_sanity_val_steps(0);
  opts.enable_checkpointing(false).enable_progress_bar(false).enable_model_summary(false).logger(false).handle_signals(s.handle_signals);
  opts.callbacks({std::make_shared<BenchCallback>(s)});
  fulgur::Trainer trainer(opts);
  trainer.fit(*model, loader);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"fulgur's side of the benchmarks (bench/run.py drives it)"};
  Settings s;
  std::string models_arg = "mlp";
  app.add_option("--model", models_arg, "mlp, cnn, charlm, or a list run one after the other: mlp,cnn");
  app.add_option("--accelerator", s.accelerator,
                 "cpu (DDPStrategy), cuda (one device: SingleDeviceStrategy, else DDP) or xla (XLAStrategy; one "
                 "device: single_xla; PJRT_DEVICE picks the plugin)");
  app.add_option("--devices", s.devices, "processes");
  app.add_option("--threads", s.threads, "torch and BLAS threads per process (0: cores / devices, the trainer's policy)");
  app.add_option("--batch-size", s.batch_size, "per process (0: 64 for MNIST, 32 for charlm)");
  app.add_option("--warmup", s.warmup, "untimed steps first (>= 1)");
  app.add_option("--steps", s.steps, "timed steps");
  app.add_option("--num-workers", s.num_workers, "DataLoader worker threads");
  app.add_option("--seed", s.seed, "sampler seed");
  app.add_option("--train-samples", s.train_samples, "MNIST: use the first N training images (0: all 55,000)");
  app.add_option("--data-dir", s.data_dir, "holds mnist/ and kjv.txt");
  app.add_option("--init-dir", s.init_dir, "initial weights <init-dir>/<model>.pt (reference.py --mode init)")->required();
  app.add_option("--out", s.out, "result prefix: <out>_<model>.<rank>.json")->required();
  app.add_option("--fail-rank", s.fail_rank, "fault injection: this rank throws at the end of step --fail-step (-1: none)");
  app.add_option("--fail-step", s.fail_step, "the global step after which --fail-rank throws");
  app.add_flag("--raw-allreduce", s.raw_allreduce, "also time a raw all-reduce of the gradient bytes");
  app.add_option("--ddp-comm-hook", s.ddp_comm_hook,
                 "none or bf16_compress_hook (ParallelOptions::ddp_comm_hook; the aligned sync uses it too)");
  app.add_flag("!--no-signal-check", s.handle_signals,
               "TrainerOptions::handle_signals(false): no per-step stop-signal decision (an all-reduce on several processes)");
  CLI11_PARSE(app, argc, argv);

  // This process does no timed work; each worker sets its own threads.
  at::set_num_threads(1);
  if (s.threads <= 0) {
    cpu_set_t set;
    CPU_ZERO(&set);
    const int64_t cores = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
    s.threads = std::max<int64_t>(1, cores / std::max<int64_t>(1, s.devices));
  }
  std::istringstream model_list(models_arg);
  try {
    for (std::string m; std::getline(model_list, m, ',');) {
      s.model = m;
      run(s);
    }
  } catch (const fulgur::WorkerFailure& e) {
    std::fprintf(stderr, "fulgur_bench: %s\n", e.what());
    return e.exit_code();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fulgur_bench: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
