#!/usr/bin/env python3
"""Benchmarks fulgur against the plain PyTorch references (bench/reference.py).

For each model (MNIST MLP, MNIST CNN, character transformer) and process count
(1, 2), trains the same model from the same initial weights on the same data,
batch size and steps:
  fulgur DDPStrategy on cpu devices   against  Python DDP over Gloo (eager)
  fulgur XLAStrategy on xla devices   against  Python torch._lazy (lazy)
First it checks that both sides computed the same thing (the loss after a few
steps, within --rtol); only then does it time them. Each repetition runs the two
sides of a pair back to back, in alternating order, and the figure reported is
the median over repetitions of the per-repetition ratio (the 2 cores are shared
with other work, so absolute times drift; paired ratios drift much less).

Ends with a summary block, one figure per line as `name value`.
  bench/run.py                               # the full run (~15-25 minutes on a shared 2-core machine)
  bench/run.py --reps 1 --steps-scale 0.5    # a quick look
  bench/run.py --equality-only --tiny   # the CI check (a few steps per model)
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = ["mlp", "cnn", "charlm"]
# Batch sizes per process: the defaults of fulgur_bench and reference.py.
# Steps are per model so each timed run lasts a few seconds.
STEPS = {"mlp": 100, "cnn": 30, "charlm": 15}
WARMUP = {"mlp": 20, "cnn": 10, "charlm": 6}
BAR_EAGER = {"mlp": 1.5, "cnn": 1.15, "charlm": 1.15}
BAR_LAZY = 1.3


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bin", default=os.path.join(ROOT, "build", "bin", "fulgur_bench"))
    p.add_argument("--python", default="/usr/bin/python3", help="the interpreter that has Debian's python3-torch")
    p.add_argument("--data-dir", default=os.path.join(ROOT, "data"))
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--procs", default="1,2")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--steps-scale", type=float, default=1.0, help="multiply the timed steps of every model")
    p.add_argument("--equality-steps", type=int, default=6)
    p.add_argument("--rtol", type=float, default=1e-4)
    p.add_argument("--equality-only", action="store_true")
    p.add_argument("--tiny", action="store_true", help="equality on 3 steps (CI)")
    p.add_argument("--skip-lazy", action="store_true")
    p.add_argument("--memory-epochs", type=int, default=4, help="epochs of the memory-growth run (0: skip)")
    p.add_argument("--keep", action="store_true", help="keep the work folder")
    return p.parse_args()


class Runner:
    def __init__(self, args, work):
        self.args = args
        self.work = work
        self.n = 0
        cores = len(os.sched_getaffinity(0))
        self.cores = cores

    def env(self, nproc, threads):
        # Both sides get the thread environment fulgur's launcher gives its
        # workers (src/runtime/threads.cpp), so neither side is misconfigured,
        # and a passive OpenMP wait even for one process: these machines are
        # shared, and with spinning threads a 2-thread step varied 3-10x
        # from run to run (CNN step 355-384 ms spinning, 117-145 ms passive).
        env = dict(os.environ)
        env["OMP_NUM_THREADS"] = str(threads)
        env["OPENBLAS_NUM_THREADS"] = str(threads)
        env["OMP_WAIT_POLICY"] = "PASSIVE"
        return env

    def call(self, cmd, env):
        proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=1800)
        if proc.returncode != 0:
            raise SystemExit(f"run.py: {' '.join(cmd)}\nexited with {proc.returncode}:\n{proc.stdout[-4000:]}")

    def python(self, modes, models, nproc, warmup, steps, threads=0, extra=()):
        """Runs the references: every mode and model in one Python process.
        Returns {(mode, model): per-rank results}."""
        self.n += 1
        out = os.path.join(self.work, f"r{self.n}")
        t = threads or max(1, self.cores // nproc)
        self.call([self.args.python, os.path.join(ROOT, "bench", "reference.py"), "--mode", ",".join(modes),
                   "--model", ",".join(models), "--nproc", str(nproc),
                   "--warmup", str(warmup), "--steps", str(steps), "--data-dir", self.args.data_dir,
                   "--init-dir", self.work, "--out", out, "--threads", str(t)] + list(extra), self.env(nproc, t))
        return {(mode, model): self.load(f"{out}_{mode}_{model}", nproc) for mode in modes for model in models}

    def fulgur(self, side, models, nproc, warmup, steps, threads=0, extra=()):
        """Runs fulgur_bench on every model in one process. Returns {model: per-rank results}."""
        self.n += 1
        out = os.path.join(self.work, f"r{self.n}")
        t = threads or max(1, self.cores // nproc)
        self.call([self.args.bin, "--accelerator", "cpu" if side == "ddp" else "xla", "--devices", str(nproc),
                   "--model", ",".join(models), "--warmup", str(warmup), "--steps", str(steps),
                   "--data-dir", self.args.data_dir, "--init-dir", self.work, "--out", out, "--threads", str(t)]
                  + list(extra), self.env(nproc, t))
        return {model: self.load(f"{out}_{model}", nproc) for model in models}

    def run(self, side, model, nproc, warmup, steps, threads=0, extra=()):
        """Runs one side; returns the list of per-rank result dicts."""
        if side in ("ddp", "xla"):
            return self.fulgur(side, [model], nproc, warmup, steps, threads, extra)[model]
        return self.python([side], [model], nproc, warmup, steps, threads, extra)[(side, model)]

    @staticmethod
    def load(prefix, nproc):
        res = []
        for r in range(nproc):
            with open(f"{prefix}.{r}.json") as f:
                res.append(json.load(f))
        return res

    def init(self, models):
        subprocess.run([self.args.python, os.path.join(ROOT, "bench", "reference.py"), "--mode", "init",
                        "--model", ",".join(models), "--data-dir", self.args.data_dir, "--init-dir", self.work],
                       check=True)


def equality(runner, models, procs, steps, rtol, pairs):
    """Both sides' per-rank loss after `steps` steps from the same weights and data."""
    ok = True
    print(f"== equality: loss after {steps} steps, same initial weights and data order, rtol {rtol}")
    for nproc in procs:
        # Each side runs every model in one process (Python starts slowly).
        refs = runner.python([ref for _, ref in pairs], models, nproc, 1, steps - 1)
        ours_res = {ours: runner.fulgur(ours, models, nproc, 1, steps - 1) for ours, _ in pairs}
        for model in models:
            for ours, ref in pairs:
                a = ours_res[ours][model]
                b = refs[(ref, model)]
                for ra, rb in zip(a, b):
                    la, lb = ra["final_loss"], rb["final_loss"]
                    rel = abs(la - lb) / max(abs(lb), 1e-12)
                    good = rel <= rtol
                    ok &= good
                    print(f"  {model:7s} {nproc}p rank {ra['rank']}  fulgur_{ours} {la:.7f}  python_{ref} {lb:.7f}"
                          f"  rel {rel:.1e}  {'ok' if good else 'DIFFERENT'}")
    return ok


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def main():
    args = parse_args()
    if not os.path.exists(args.bin):
        raise SystemExit(f"run.py: {args.bin} is missing; build it (make build)")
    models = [m for m in args.models.split(",") if m]
    procs = [int(p) for p in args.procs.split(",") if p]
    pairs = [("ddp", "eager")] + ([] if args.skip_lazy else [("xla", "lazy")])
    work = tempfile.mkdtemp(prefix="fulgur-bench-")
    runner = Runner(args, work)
    runner.init(models)
    t_start = time.time()
    print(f"machine: {runner.cores} cores; {os.uname().sysname} {os.uname().release}; work folder {work}")

    eq_steps = 3 if args.tiny else args.equality_steps
    if not equality(runner, models, procs, eq_steps, args.rtol, pairs):
        print("run.py: the two sides computed different losses; no ratios reported")
        return 1
    if args.equality_only:
        print("equality: ok")
        return 0

    # --- throughput: alternate the two sides of each pair -----------------------
    sps = {}    # (side, model, nproc, threads) -> [samples/s per rep]
    ratio = {}  # (pair, model, nproc) -> [ratio per rep]
    recs = {}   # (side, model, nproc, threads) -> [per-rank results of every rep]

    def record(side, model, nproc, threads, res):
        key = (side, model, nproc, threads)
        sps.setdefault(key, []).append(res[0]["samples_per_s"])
        recs.setdefault(key, []).append(res)
        return res[0]["samples_per_s"]

    for rep in range(args.reps):
        for model in models:
            steps = max(2, int(STEPS[model] * args.steps_scale))
            warm = WARMUP[model]
            for nproc in procs:
                t = max(1, runner.cores // nproc)
                for ours, ref in pairs:
                    order = [ours, ref] if rep % 2 == 0 else [ref, ours]
                    got = {}
                    for side in order:
                        extra = ["--raw-allreduce"] if side in ("ddp", "eager") and nproc > 1 else []
                        got[side] = record(side, model, nproc, t, runner.run(side, model, nproc, warm, steps, t, extra))
                    ratio.setdefault((ours, model, nproc), []).append(got[ours] / got[ref])
                    print(f"  rep {rep + 1} {model:7s} {nproc}p  fulgur_{ours} {got[ours]:9.1f}/s  "
                          f"python_{ref} {got[ref]:9.1f}/s  ratio {got[ours] / got[ref]:.2f}", flush=True)
            if 1 in procs and 2 in procs:
                # Scaling: 1 process with one thread, against the 2-process run above.
                record("ddp", model, 1, 1, runner.run("ddp", model, 1, warm, steps, 1))

    # --- memory across epochs ------------------------------------------------------
    mem = {}
    if args.memory_epochs > 0:
        for side in ["ddp"] + ([] if args.skip_lazy else ["xla"]):
            if "cnn" not in models:
                break
            n_train = 64 * 2 * 50  # 50 steps an epoch on 2 processes
            res = runner.run(side, "cnn", 2 if 2 in procs else 1, 1, 50 * args.memory_epochs - 1, 0,
                             ["--train-samples", str(n_train)])
            mem[side] = [r["rss_mb_by_epoch"] for r in res]

    # --- report --------------------------------------------------------------------
    summary = {}
    print()
    print(f"== samples/s end to end (median of {args.reps} paired repetitions; ratio = median of per-rep ratios)")
    print(f"  {'model':7s} {'procs':>5s}  {'pair':22s} {'fulgur/s':>10s} {'python/s':>10s} {'ratio':>6s} {'bar':>5s}")
    for model in models:
        for nproc in procs:
            t = max(1, runner.cores // nproc)
            for ours, ref in pairs:
                r = median(ratio[(ours, model, nproc)])
                bar = BAR_EAGER[model] if ours == "ddp" else BAR_LAZY
                print(f"  {model:7s} {nproc:5d}  {'fulgur_' + ours + ' / python_' + ref:22s} "
                      f"{median(sps[(ours, model, nproc, t)]):10.1f} {median(sps[(ref, model, nproc, t)]):10.1f} "
                      f"{r:6.2f} {bar:5.2f} {'met' if r >= bar else 'NOT MET'}")
                name = "ddp" if ours == "ddp" else "lazy"
                summary[f"speedup_vs_python_{name}_{nproc}proc_{model}"] = r

    if 1 in procs and 2 in procs:
        print()
        print("== scaling, fulgur DDP (samples/s, medians)")
        for model in models:
            two = median(sps[("ddp", model, 2, 1)])
            one1 = median(sps[("ddp", model, 1, 1)])
            one2 = median(sps[("ddp", model, 1, runner.cores)])
            print(f"  {model:7s} 2p x 1 thread {two:9.1f}  1p x 1 thread {one1:9.1f}  1p x {runner.cores} threads "
                  f"{one2:9.1f}  2p/1p1t {two / one1:.2f}  2p/1p{runner.cores}t {two / one2:.2f}")
            summary[f"scaling_2proc_{model}"] = two / one1

    if not args.skip_lazy and 1 in procs:
        print()
        print("== lazy overhead: fulgur xla step / fulgur cpu step, 1 process (medians); graphs compiled")
        for model in models:
            t = runner.cores
            x = median([res[0]["step_seconds"] for res in recs[("xla", model, 1, t)]])
            e = median([res[0]["step_seconds"] for res in recs[("ddp", model, 1, t)]])
            g = max(res[0]["graphs_compiled"] for res in recs[("xla", model, 1, t)])
            g2 = max(r["graphs_compiled"] for res in recs.get(("xla", model, 2, 1), []) for r in res) \
                if 2 in procs else None
            gl = max(res[0]["graphs_compiled"] for res in recs[("lazy", model, 1, t)])
            print(f"  {model:7s} xla {x * 1e3:7.2f} ms  cpu {e * 1e3:7.2f} ms  ratio {x / e:.2f}   graphs compiled: "
                  f"fulgur {g} (1p), {g2} (2p); python lazy {gl} (1p)")
            summary[f"xla_step_over_eager_{model}"] = x / e

    if 2 in procs:
        print()
        print("== gradient sync, fulgur DDP 2 processes, against one raw Gloo all-reduce of the same bytes")
        print("   (aligned: ranks meet at a barrier, then one sync by the bucket reducer / one raw all-reduce,")
        print("    interleaved, 60 each, medians; in step: time in the sync per training step, which also")
        print("    counts waiting for the slower rank's backward)")
        worst = 0.0
        for model in models:
            rs = recs[("ddp", model, 2, 1)]
            in_step = median([max(r["sync_seconds_per_step"] for r in res) for res in rs])
            sync = median([max(r["aligned_sync_seconds"] for r in res) for res in rs])
            raw = median([max(r["raw_allreduce_seconds"] for r in res) for res in rs])
            pyraw = median([res[0]["raw_allreduce_seconds"] for res in recs[("eager", model, 2, 1)]])
            nbytes = rs[0][0]["grad_bytes"]
            print(f"  {model:7s} {nbytes / 2**20:6.2f} MiB  aligned sync {sync * 1e3:6.3f} ms  raw all-reduce "
                  f"{raw * 1e3:6.3f} ms ({nbytes / raw / 1e9:.2f} GB/s; torch.distributed {pyraw * 1e3:6.3f} ms)  "
                  f"ratio {sync / raw:.2f}   in step {in_step * 1e3:6.3f} ms")
            worst = max(worst, sync / raw)
        summary["sync_over_raw_allreduce"] = worst

    print()
    print("== peak resident memory per worker (MiB, max over ranks and runs)")
    for model in models:
        ours = max(r["peak_rss_mb"] for (s, m, _, _), v in recs.items() if m == model and s in ("ddp", "xla")
                   for res in v for r in res)
        theirs = max(r["peak_rss_mb"] for (s, m, _, _), v in recs.items() if m == model and s in ("eager", "lazy")
                     for res in v for r in res)
        print(f"  {model:7s} fulgur {ours:7.1f}  python {theirs:7.1f}")
        summary[f"peak_rss_mb_worker_{model}"] = ours
    for side, per_rank in mem.items():
        print(f"  cnn fulgur_{side} resident memory at each epoch end (MiB), per rank: "
              + "; ".join(" ".join(f"{v:.1f}" for v in ranks) for ranks in per_rank))

    print()
    print(f"total time {time.time() - t_start:.0f} s")
    print("== summary")
    for k, v in summary.items():
        print(f"{k} {v:.3f}" if not k.startswith("peak_rss") else f"{k} {v:.1f}")
    if not args.keep:
        subprocess.run(["rm", "-rf", work])
    return 0


if __name__ == "__main__":
    sys.exit(main())
