#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The peers a user would pick instead of fulgur: Lightning's Trainer (issue 17).

Runs in the bench environment (.venv/bench: torch 2.9.0, torch_xla 2.9.0,
lightning 2.6.x; scripts/install-bench-env), not on Debian's python3-torch.

Modes:
  ddp  Trainer(accelerator="cpu", strategy="ddp", devices=N): Lightning's own
       DDPStrategy and its default launcher (the script is started again for
       each further rank, as `python train.py` does for a user).
  cuda Trainer(accelerator="gpu", devices=N): one GPU is SingleDeviceStrategy,
       several DDP over NCCL (scripts/device-check runs it on the GPU machine).
  xla  Lightning on torch_xla with PJRT_DEVICE=CPU and CPU_NUM_DEVICES=N:
       SingleDeviceXLAStrategy on one device, XLAStrategy on N > 1 (it refuses
       one device). Lightning finds XLA devices by counting TPU chips, so on a
       CPU host its XLAAccelerator says it has none; this script patches
       XLAAccelerator.is_available and XLAAccelerator.auto_device_count (the
       fabric class and the pytorch subclass) to return True and N, as
       Lightning's own tests mock them (tests/tests_pytorch/conftest.py,
       `xla_available` / `mock_xla_available`). Nothing else is patched.

The models, their parameter names, the data files and their normalisation are
bench/reference.py's (imported from it), so the state_dict that reference.py
--mode init writes, and fulgur_bench reads, starts this side too. Each model is
wrapped in a LightningModule whose training_step returns reference.py's loss and
whose configure_optimizers returns reference.py's optimizer (Adam 1e-3 for
MNIST, AdamW 3e-3 for charlm).

Data order: a DataLoader(batch, shuffle=True, drop_last=True) as a user writes
it. Lightning replaces its sampler with DistributedSampler(shuffle=True, seed 0)
under DDPStrategy and XLAStrategy (use_distributed_sampler=True, the default),
which is the order fulgur's DataLoader(shuffle, seed 0) and reference.py use.
SingleDeviceXLAStrategy and one GPU are not distributed, so Lightning keeps the
loader's RandomSampler there; for those cases this script gives the loader
DistributedSampler(num_replicas=1, rank=0, shuffle=True, seed=0), the same order.

Trainer settings, the same as fulgur_bench's TrainerOptions: logger=False,
enable_progress_bar=False, enable_checkpointing=False,
enable_model_summary=False, num_sanity_val_steps=0, max_steps=warmup+steps,
max_epochs=-1; no validation data.

Each rank writes <out>_<mode>_<model>.<rank>.json with the fields of
reference.py's results, plus first_step_unix (wall-clock time at the end of the
first step, after loss.item()) for the start-up figure.

--fail-rank R --fail-step S: rank R raises RuntimeError at the end of global
step S (a callback, the same place fulgur_bench --fail-rank throws), for the
fault comparison.
"""
import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", required=True, choices=["ddp", "cuda", "xla"])
    p.add_argument("--model", required=True, choices=["mlp", "cnn", "charlm"])
    p.add_argument("--data-dir", default="data")
    p.add_argument("--init-dir", required=True, help="initial weights <init-dir>/<model>.pt (reference.py --mode init)")
    p.add_argument("--out", required=True, help="result prefix: <out>_<mode>_<model>.<rank>.json")
    p.add_argument("--nproc", type=int, default=1)
    p.add_argument("--threads", type=int, default=0, help="torch threads per process (0: cores / nproc)")
    p.add_argument("--batch-size", type=int, default=0, help="per process (0: 64 for MNIST, 32 for charlm)")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--fail-rank", type=int, default=-1)
    p.add_argument("--fail-step", type=int, default=3)
    args = p.parse_args(argv)
    if args.threads <= 0:
        args.threads = max(1, len(os.sched_getaffinity(0)) // args.nproc)
    args.batch_size = args.batch_size or (32 if args.model == "charlm" else 64)
    return args


ARGS = parse_args() if __name__ == "__main__" else None
if ARGS is not None and ARGS.mode == "xla":
    # Before torch_xla is imported (by Lightning or by us).
    os.environ["PJRT_DEVICE"] = "CPU"
    os.environ["CPU_NUM_DEVICES"] = str(ARGS.nproc)

import torch  # noqa: E402
try:  # the `lightning` package, or the older `pytorch-lightning` one
    import lightning.pytorch as pl  # noqa: E402
except ImportError:
    import pytorch_lightning as pl  # noqa: E402
from torch.utils.data import DataLoader, DistributedSampler  # noqa: E402

sys.path.insert(0, HERE)
import reference as ref  # noqa: E402

# The classes are at module level: torch_xla's launcher pickles the trainer and the module
# to hand them to its worker process (forked; ARGS is inherited).

class Module(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = ref.make_model(ARGS.model, ARGS.data_dir)
        self.net.load_state_dict(torch.load(ref.init_path(ARGS)))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return ref.loss_of(ARGS.model, self.net, x, y)

    def configure_optimizers(self):
        return ref.make_optimizer(ARGS.model, self.parameters())

    def train_dataloader(self):
        dataset = ref.make_dataset(ARGS.model, ARGS.data_dir)
        if self.trainer.world_size == 1 and ARGS.mode in ("xla", "cuda"):
            sampler = DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True, seed=0)
            return DataLoader(dataset, batch_size=ARGS.batch_size, sampler=sampler, drop_last=True)
        return DataLoader(dataset, batch_size=ARGS.batch_size, shuffle=True, drop_last=True)

class Bench(pl.Callback):
    """Times steps [warmup, warmup + steps) at step boundaries, after loss.item()."""

    def __init__(self):
        self.first_step_unix = 0.0
        self.start = None
        self.elapsed = None
        self.loss = None
        self.sampler = ""

    def on_train_start(self, trainer, module):
        torch.set_num_threads(ARGS.threads)
        self.sampler = type(trainer.train_dataloader.sampler).__name__

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        step = trainer.global_step
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        if step == 1:
            loss.item()
            self.first_step_unix = time.time()
        if trainer.global_rank == ARGS.fail_rank and step == ARGS.fail_step:
            with open(ARGS.out + ".fault_unix", "w") as f:
                f.write(f"{time.time():.6f}\n")
            raise RuntimeError(f"injected fault at step {ARGS.fail_step}")
        if step == ARGS.warmup:
            loss.item()
            self.start = time.perf_counter()
        if step == ARGS.warmup + ARGS.steps:
            self.loss = loss.item()
            self.elapsed = time.perf_counter() - self.start

    def on_train_end(self, trainer, module):
        world = trainer.world_size
        res = {
            "side": "lightning_" + ARGS.mode,
            "model": ARGS.model,
            "rank": trainer.global_rank,
            "world_size": world,
            "strategy": type(trainer.strategy).__name__,
            "sampler": self.sampler,
            "threads": torch.get_num_threads(),
            "steps": ARGS.steps,
            "warmup": ARGS.warmup,
            "batch_size": ARGS.batch_size,
            "seconds": self.elapsed,
            "samples_per_s": ARGS.batch_size * world * ARGS.steps / self.elapsed,
            "step_seconds": self.elapsed / ARGS.steps,
            "final_loss": self.loss,
            "first_step_unix": self.first_step_unix,
            "peak_rss_mb": ref.peak_rss_mb(),
            "pid": os.getpid(),
            "versions": {"torch": torch.__version__, "lightning": pl.__version__},
        }
        if ARGS.mode == "xla":
            import torch_xla
            import torch_xla.debug.metrics as met
            res["versions"]["torch_xla"] = torch_xla.__version__
            res["graphs_compiled"] = int((met.metric_data("CompileTime") or [0])[0])
        with open(f"{ARGS.out}_{ARGS.mode}_{ARGS.model}.{trainer.global_rank}.json", "w") as f:
            json.dump(res, f)


def main():
    args = ARGS
    torch.set_num_threads(args.threads)
    common = dict(max_steps=args.warmup + args.steps, max_epochs=-1, logger=False, enable_progress_bar=False,
                  enable_checkpointing=False, enable_model_summary=False, num_sanity_val_steps=0,
                  callbacks=[Bench()])
    if args.mode == "ddp":
        trainer = pl.Trainer(accelerator="cpu", strategy="ddp", devices=args.nproc, **common)
    elif args.mode == "cuda":
        trainer = pl.Trainer(accelerator="gpu", devices=args.nproc, **common)
    else:
        from lightning.fabric.accelerators.xla import XLAAccelerator as FabricXLAAccelerator
        from lightning.pytorch.accelerators import XLAAccelerator
        from lightning.pytorch.strategies import SingleDeviceXLAStrategy, XLAStrategy

        # The patch Lightning's tests apply (see the docstring): a CPU host has no TPU chips.
        for cls in (FabricXLAAccelerator, XLAAccelerator):
            cls.is_available = staticmethod(lambda: True)
            cls.auto_device_count = staticmethod(lambda: args.nproc)
        if args.nproc == 1:
            import torch_xla.core.xla_model as xm
            strategy = SingleDeviceXLAStrategy(device=xm.xla_device())
        else:
            strategy = XLAStrategy()
        trainer = pl.Trainer(accelerator=XLAAccelerator(), strategy=strategy, devices=args.nproc, **common)
    trainer.fit(Module())


if __name__ == "__main__":
    main()
