#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""What a Python side's training step spends its time on (issue 17: where a bar is not met).

Runs one of bench/reference.py's models for --warmup + --steps steps in one process, the way
the bench runs it, and profiles the timed steps with torch.profiler (CPU activities):
  plain      reference.py's eager loop: DistributedDataParallel over Gloo (world 1),
             DataLoader with a DistributedSampler, opt.zero_grad / backward / step
  lightning  Trainer(accelerator="cpu", strategy="ddp", devices=1) on the same
             LightningModule as bench/lightning_reference.py, profiled from a callback
  xla        Lightning on torch_xla (PJRT_DEVICE=CPU, SingleDeviceXLAStrategy): no op table
             (the ops are traced, not run); prints torch_xla's metrics report instead
             (compile and execute counts and times)

Prints the wall time per step, the operators by self CPU time (their share of the profiled
wall time) and the framework's own code: the self time of the ranges a framework opens
around its Python (DistributedDataParallel.forward, Optimizer.step#AdamW.step, Lightning's
hooks) plus the time outside every range and operator (the loop, the interpreter and the
profiler's own cost). The profiler
adds a few microseconds per op, so the shares, not the absolute times, are the result.

Run it with the interpreter whose torch you want: Debian's /usr/bin/python3 (torch 1.13, the
kernels fulgur uses) or the bench environment's .venv/bench/bin/python (torch 2.9). For
fulgur's side (C++, no torch.profiler) use perf on fulgur_bench; bench/history/libtorch-1.13.md has both.
  OMP_NUM_THREADS=2 OMP_WAIT_POLICY=PASSIVE /usr/bin/python3 bench/profile_step.py --side plain --model charlm
"""
import argparse
import os
import re
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--side", required=True, choices=["plain", "lightning", "xla"])
    p.add_argument("--model", required=True, choices=["mlp", "cnn", "charlm"])
    p.add_argument("--data-dir", default=os.path.join(os.path.dirname(HERE), "data"))
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: the cores of this process)")
    p.add_argument("--warmup", type=int, default=6)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--top", type=int, default=15, help="operators listed")
    p.add_argument("--no-op-table", action="store_true",
                   help="time the steps without torch.profiler (for perf: the timed window is printed in "
                        "CLOCK_MONOTONIC seconds, for `perf record -k mono` and `perf report --time START,END`)")
    args = p.parse_args()
    if args.warmup < 1 or args.steps < 1:
        raise SystemExit(f"profile_step.py: --warmup {args.warmup} --steps {args.steps}: both must be at least 1")
    if args.threads <= 0:
        args.threads = len(os.sched_getaffinity(0))
    return args


OP_PREFIXES = ("aten::", "autograd::", "c10d::", "gloo:", "torch::autograd")


def report(prof, wall, steps, top):
    if prof is None:
        print(f"wall per step {wall / steps * 1e3:.2f} ms over {steps} steps")
        return
    events = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
    events.sort(key=lambda e: -e.self_cpu_time_total)
    inside = sum(e.self_cpu_time_total for e in events) / 1e6
    # Ranges a framework opens around its own Python (DistributedDataParallel.forward,
    # Optimizer.step#AdamW.step, Lightning's hooks): their self time is that Python, not an op's.
    # Autograd's nodes (AddmmBackward0) are the engine's, counted with the operators.
    ranges = sum(e.self_cpu_time_total for e in events
                 if not e.key.startswith(OP_PREFIXES) and not re.search(r"Backward\d*$", e.key)) / 1e6
    print(f"wall per step {wall / steps * 1e3:.2f} ms over {steps} steps; in operators "
          f"{(inside - ranges) / wall * 100:.1f} %; framework code: in the framework's own ranges "
          f"{ranges / wall * 100:.1f} % + outside every range and operator {(wall - inside) / wall * 100:.1f} % "
          f"= {(wall - inside + ranges) / steps * 1e3:.2f} ms a step")
    print(f"  {'operator':44s} {'calls/step':>10s} {'self ms/step':>12s} {'share':>6s}")
    for e in events[:top]:
        print(f"  {e.key[:44]:44s} {e.count / steps:10.1f} {e.self_cpu_time_total / 1e3 / steps:12.3f} "
              f"{e.self_cpu_time_total / 1e6 / wall * 100:5.1f}%")


def run_plain(args, torch, ref):
    import torch.distributed as dist
    import torch.nn as nn
    from torch.profiler import ProfilerActivity, profile

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{ref.free_port()}", rank=0, world_size=1)
    torch.manual_seed(0)
    dataset = ref.make_dataset(args.model, args.data_dir)
    model = nn.parallel.DistributedDataParallel(ref.make_model(args.model, args.data_dir))
    opt = ref.make_optimizer(args.model, model.parameters())
    ref_args = argparse.Namespace(batch_size=32 if args.model == "charlm" else 64, seed=0, num_workers=0)
    loader, sampler = ref.make_loader(ref_args, dataset, 0, 1)
    it = ref.batches(loader, sampler)

    def step():
        x, y = next(it)
        opt.zero_grad()
        loss = ref.loss_of(args.model, model, x, y)
        loss.backward()
        opt.step()
        return loss

    for _ in range(args.warmup):
        step().item()
    prof = None if args.no_op_table else profile(activities=[ProfilerActivity.CPU])
    if prof is not None:
        prof.__enter__()
    t = window_start()
    for _ in range(args.steps):
        loss = step()
    loss.item()
    wall = window_end(t)
    if prof is not None:
        prof.__exit__(None, None, None)
    report(prof, wall, args.steps, args.top)
    dist.destroy_process_group()


def run_lightning(args, torch, ref, xla):
    if xla:
        os.environ["PJRT_DEVICE"] = "CPU"
        os.environ["CPU_NUM_DEVICES"] = "1"
    import lightning.pytorch as pl
    from torch.profiler import ProfilerActivity, profile
    from torch.utils.data import DataLoader, DistributedSampler

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.net = ref.make_model(args.model, args.data_dir)

        def training_step(self, batch, batch_idx):
            return ref.loss_of(args.model, self.net, *batch)

        def configure_optimizers(self):
            return ref.make_optimizer(args.model, self.parameters())

        def train_dataloader(self):
            dataset = ref.make_dataset(args.model, args.data_dir)
            batch = 32 if args.model == "charlm" else 64
            sampler = DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True, seed=0)
            return DataLoader(dataset, batch_size=batch, sampler=sampler, drop_last=True)

    class Profile(pl.Callback):
        def __init__(self):
            self.prof, self.t, self.wall = None, 0.0, 0.0

        def on_train_start(self, trainer, module):
            torch.set_num_threads(args.threads)

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            step = trainer.global_step
            loss = outputs["loss"] if isinstance(outputs, dict) else outputs
            if step == args.warmup:
                loss.item()
                if not xla and not args.no_op_table:
                    self.prof = profile(activities=[ProfilerActivity.CPU])
                    self.prof.__enter__()
                self.t = window_start()
            if step == args.warmup + args.steps:
                loss.item()
                self.wall = window_end(self.t)
                if self.prof is not None:
                    self.prof.__exit__(None, None, None)

    cb = Profile()
    common = dict(max_steps=args.warmup + args.steps, max_epochs=-1, logger=False, enable_progress_bar=False,
                  enable_checkpointing=False, enable_model_summary=False, num_sanity_val_steps=0, callbacks=[cb])
    if xla:
        import torch_xla.core.xla_model as xm
        import torch_xla.debug.metrics as met
        from lightning.fabric.accelerators.xla import XLAAccelerator as FabricXLAAccelerator
        from lightning.pytorch.accelerators import XLAAccelerator
        from lightning.pytorch.strategies import SingleDeviceXLAStrategy

        # The patch bench/lightning_reference.py applies, as Lightning's own tests do.
        for cls in (FabricXLAAccelerator, XLAAccelerator):
            cls.is_available = staticmethod(lambda: True)
            cls.auto_device_count = staticmethod(lambda: 1)
        trainer = pl.Trainer(accelerator=XLAAccelerator(), strategy=SingleDeviceXLAStrategy(device=xm.xla_device()),
                             devices=1, **common)
        trainer.fit(Module())
        print(f"wall per step {cb.wall / args.steps * 1e3:.2f} ms over {args.steps} steps (after {args.warmup} "
              "warm-up steps); torch_xla's metrics over the whole run:")
        print(met.short_metrics_report())
        for name in ("CachedCompile", "UncachedCompile", "MarkStep"):
            print(f"  counter {name}: {met.counter_value(name)}")
        return
    trainer = pl.Trainer(accelerator="cpu", strategy="ddp", devices=1, **common)
    trainer.fit(Module())
    report(cb.prof, cb.wall, args.steps, args.top)


def window_start():
    return time.clock_gettime(time.CLOCK_MONOTONIC)


def window_end(start):
    """Prints the timed window (CLOCK_MONOTONIC, perf's `-k mono` clock); returns its length."""
    end = time.clock_gettime(time.CLOCK_MONOTONIC)
    print(f"timed window (CLOCK_MONOTONIC): {start:.6f},{end:.6f}", flush=True)
    return end - start


def main():
    args = parse_args()
    import torch
    sys.path.insert(0, HERE)
    import reference as ref
    torch.set_num_threads(args.threads)
    print(f"profile_step.py: side {args.side}, model {args.model}, torch {torch.__version__}, {args.threads} "
          f"thread(s), BLAS: {blas_of(torch)}")
    if args.side == "plain":
        run_plain(args, torch, ref)
    else:
        run_lightning(args, torch, ref, xla=args.side == "xla")


def blas_of(torch):
    m = re.search(r"BLAS_INFO=([^,\s]+)", torch.__config__.show())
    return m.group(1) if m else "unknown"


if __name__ == "__main__":
    main()
