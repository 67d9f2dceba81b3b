#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
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

With --lightning (make bench passes it), also against the peers of issue 17, in the
bench environment (.venv/bench, scripts/install-bench-env; bench/lightning_reference.py):
  fulgur DDPStrategy                  against  Lightning Trainer(strategy="ddp")
  fulgur XLAStrategy                  against  Lightning on torch_xla (PJRT_DEVICE=CPU)
equality first (rtol 1e-5 against DDP, 1e-4 against torch_xla; a row that differs or does
not run gets no ratio), then samples/s, start-up to the first finished step, peak RSS
and loss in the same paired repetitions. --same-malloc adds the Python sides again with
fulgur's malloc policy (GLIBC_TUNABLES); --fault the fault table (rank 1 raises at step 3).

What make bench leaves out to stay under the issue's 25 minutes on 2 cores (session 6's
3-repetition run took 27 min 12 s, 481 s of it in the *_same_malloc sides): those sides run
in the first repetition only (--same-malloc-reps 1), so their keys are one paired ratio each,
not medians (the summary's same_malloc_repetitions says how many); they say how much of a
ratio is the allocator, the figures of record are the medians without them. The timed steps
stay as they were: a run is mostly start-up (Lightning DDP charlm, 1 process: 10.7 s to the
first step, 3.0 s of timed steps, 3 s to exit, under load 8), so fewer steps would save little.

Every side gets the same thread environment (cores split, OMP_WAIT_POLICY=PASSIVE) and,
where Debian's OpenBLAS does not know the CPU and would run its SSE3 Prescott kernels, the
same OPENBLAS_CORETYPE (--openblas-coretype; the header line says what was set).

Ends with a summary block, one figure per line as `name value`.
  bench/run.py                               # the full run (about 22 min on a quiet 2-core machine, estimated)
  bench/run.py --reps 1 --steps-scale 0.5    # a quick look
  bench/run.py --equality-only --tiny   # the CI check (a few steps per model)
  bench/run.py --limit-only --reps 3    # issue 35's limit rows alone (about 2 min)
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
BAR_LIGHTNING_DDP = {"mlp": 1.5, "cnn": 1.5, "charlm": 1.1}
BAR_LIGHTNING_XLA = 1.5
BAR_STARTUP = 0.5
# fulgur's allocator policy (src/runtime/memory.{h,cpp}: mallopt M_MMAP_THRESHOLD 512 MiB,
# M_TRIM_THRESHOLD 1 GiB) as a Python user sets it: the *_same_malloc sides.
SAME_MALLOC = "glibc.malloc.mmap_threshold=536870912:glibc.malloc.trim_threshold=1073741824"
SM = "_same_malloc"
# The plain PyTorch script (reference.py, eager) run by the bench environment's torch 2.9, the torch
# Lightning runs on: it splits fulgur / Lightning into the language and the framework (against
# reference.py on Debian's torch 1.13, the kernels fulgur used before libtorch 2.11), the torch
# version's kernels, and Lightning's own cost (against the plain loop on the same torch).
T29 = "eager_torch29"


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
    p.add_argument("--lightning", action="store_true",
                   help="also run the peers of issue 17: Lightning DDP and Lightning on torch_xla (bench venv)")
    p.add_argument("--bench-python", default=os.path.join(ROOT, ".venv", "bench", "bin", "python"),
                   help="the interpreter of the bench environment (scripts/install-bench-env)")
    p.add_argument("--same-malloc", action="store_true",
                   help="also run the Python sides with fulgur's malloc policy (GLIBC_TUNABLES): *_same_malloc keys")
    p.add_argument("--same-malloc-reps", type=int, default=1,
                   help="with --same-malloc, the repetitions (the first N) that run the *_same_malloc sides; they "
                        "are a third of the run's time, and the keys say how the allocator moves a ratio, not "
                        "a figure of record (default 1; --reps for every repetition)")
    p.add_argument("--dump", help="also write every run's results to this JSON file")
    p.add_argument("--fault", action="store_true", help="the fault comparison: 2 processes, rank 1 raises at step 3")
    p.add_argument("--fault-only", action="store_true", help="only the fault table (with --lightning: all four rows)")
    p.add_argument("--fault-timeout", type=float, default=120.0)
    p.add_argument("--openblas-coretype", default="auto",
                   help="OPENBLAS_CORETYPE for every side: 'auto' sets it only where Debian's OpenBLAS (the BLAS of "
                        "libtorch 1.13: fulgur and reference.py) does not know this CPU and falls back to its SSE3 "
                        "'Prescott' kernels (then SkylakeX on an AVX-512 CPU, Haswell on AVX2); 'none' never sets it; "
                        "or a core name, as OpenBLAS spells it")
    p.add_argument("--limit-only", action="store_true",
                   help="only the limit rows (issue 35): per model a 2-process run with the raw all-reduces and two "
                        "independent 1-process 1-thread runs, --reps times")
    p.add_argument("--lightning-rtol-ddp", type=float, default=1e-5)
    p.add_argument("--lightning-rtol-xla", type=float, default=1e-4)
    return p.parse_args()


def openblas_coretype(choice):
    """(the core Debian's OpenBLAS picks here, the OPENBLAS_CORETYPE to give every side or None).
    OpenBLAS 0.3.21 (Debian 12) picks its kernels by CPU model; a model it does not know (here
    family 6 model 207) gets the SSE3 'Prescott' kernels: sgemm at 8-14 GFLOP/s against 47-71
    with SkylakeX's on this machine (2048x128 by 128x512, measured in session 7)."""
    import ctypes
    try:
        lib = ctypes.CDLL("libopenblas.so.0")
        lib.openblas_get_corename.restype = ctypes.c_char_p
        detected = lib.openblas_get_corename().decode()
    except (OSError, AttributeError):
        detected = "none (libopenblas.so.0 not found)"
    if choice == "none":
        return detected, None
    if choice != "auto":
        return detected, choice
    if detected.lower() != "prescott":
        return detected, None
    with open("/proc/cpuinfo") as f:
        flags = next((ln.split(":", 1)[1].split() for ln in f if ln.startswith("flags")), [])
    if "avx512f" in flags:
        return detected, "SkylakeX"
    return detected, ("Haswell" if "avx2" in flags else None)


class Runner:
    def __init__(self, args, work):
        self.args = args
        self.work = work
        self.n = 0
        cores = len(os.sched_getaffinity(0))
        self.cores = cores
        self.spent = {}  # what the run's wall time went to: "<program>" -> seconds
        self.independent_steps = {}  # model -> [mean step seconds of two independent 1-process runs, per rep]
        self.openblas_detected, self.openblas_core = openblas_coretype(args.openblas_coretype)

    def account(self, what, seconds):
        self.spent[what] = self.spent.get(what, 0.0) + seconds

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
        # Every repetition compiles its XLA programs, as Lightning on torch_xla does: with fulgur's
        # compile cache the later ones would load the first's, and the start-up figure would
        # change meaning between repetitions.
        env["FULGUR_XLA_CACHE_DIR"] = "off"
        if self.openblas_core:
            env["OPENBLAS_CORETYPE"] = self.openblas_core
        return env

    def timed_call(self, cmd, env):
        """call(), returning the wall-clock time it was started (for the start-up figure)."""
        t = time.time()
        self.call(cmd, env)
        return t

    def lightning(self, mode, model, nproc, warmup, steps, threads=0, same_malloc=False):
        """Runs bench/lightning_reference.py (one model, a fresh process). Returns per-rank results,
        each with startup_seconds: from launching the program to the end of the first step."""
        self.n += 1
        out = os.path.join(self.work, f"r{self.n}")
        t = threads or max(1, self.cores // nproc)
        env = self.env(nproc, t)
        if same_malloc:
            env["GLIBC_TUNABLES"] = SAME_MALLOC
        t0 = self.timed_call([self.args.bench_python, os.path.join(ROOT, "bench", "lightning_reference.py"),
                              "--mode", mode, "--model", model, "--nproc", str(nproc), "--warmup", str(warmup),
                              "--steps", str(steps), "--data-dir", self.args.data_dir, "--init-dir", self.work,
                              "--out", out, "--threads", str(t)], env)
        res = self.load(f"{out}_{mode}_{model}", nproc)
        first = max(r["first_step_unix"] for r in res)
        for r in res:
            r["startup_seconds"] = first - t0
        return res

    def call(self, cmd, env):
        t = time.time()
        proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=1800)
        what = os.path.basename(cmd[1] if cmd[0].endswith(("python", "python3")) else cmd[0])
        if "GLIBC_TUNABLES" in env and env["GLIBC_TUNABLES"] == SAME_MALLOC:
            what += SM
        self.account(what, time.time() - t)
        if proc.returncode != 0:
            raise SystemExit(f"run.py: {' '.join(cmd)}\nexited with {proc.returncode}:\n{proc.stdout[-4000:]}")

    def python(self, modes, models, nproc, warmup, steps, threads=0, extra=(), same_malloc=False, python=None):
        """Runs the references: every mode and model in one Python process (Debian's python3-torch
        unless `python` names another interpreter). Returns {(mode, model): per-rank results}."""
        self.n += 1
        out = os.path.join(self.work, f"r{self.n}")
        t = threads or max(1, self.cores // nproc)
        env = self.env(nproc, t)
        if same_malloc:
            env["GLIBC_TUNABLES"] = SAME_MALLOC
        self.call([python or self.args.python, os.path.join(ROOT, "bench", "reference.py"), "--mode", ",".join(modes),
                   "--model", ",".join(models), "--nproc", str(nproc),
                   "--warmup", str(warmup), "--steps", str(steps), "--data-dir", self.args.data_dir,
                   "--init-dir", self.work, "--out", out, "--threads", str(t)] + list(extra), env)
        return {(mode, model): self.load(f"{out}_{mode}_{model}", nproc) for mode in modes for model in models}

    def fulgur(self, side, models, nproc, warmup, steps, threads=0, extra=()):
        """Runs fulgur_bench on every model in one process. Returns {model: per-rank results}."""
        self.n += 1
        out = os.path.join(self.work, f"r{self.n}")
        t = threads or max(1, self.cores // nproc)
        t0 = self.timed_call([self.args.bin, "--accelerator", "cpu" if side == "ddp" else "xla", "--devices",
                              str(nproc), "--model", ",".join(models), "--warmup", str(warmup), "--steps", str(steps),
                              "--data-dir", self.args.data_dir, "--init-dir", self.work, "--out", out, "--threads",
                              str(t)] + list(extra), self.env(nproc, t))
        got = {model: self.load(f"{out}_{model}", nproc) for model in models}
        first = max(r["first_step_unix"] for r in got[models[0]])
        for r in got[models[0]]:
            r["startup_seconds"] = first - t0  # meaningful for the first model of the list only
        return got

    def fulgur_independent(self, model, warmup, steps):
        """Two independent 1-process, 1-thread fulgur runs started at the same time: their samples/s."""
        procs, outs = [], []
        for _ in range(2):
            self.n += 1
            out = os.path.join(self.work, f"r{self.n}")
            outs.append(out)
            procs.append(subprocess.Popen(
                [self.args.bin, "--accelerator", "cpu", "--devices", "1", "--model", model, "--warmup", str(warmup),
                 "--steps", str(steps), "--data-dir", self.args.data_dir, "--init-dir", self.work, "--out", out,
                 "--threads", "1"], env=self.env(1, 1), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        t = time.time()
        for p in procs:
            text, _ = p.communicate(timeout=1800)
            if p.returncode != 0:
                raise SystemExit(f"run.py: an independent fulgur run exited with {p.returncode}:\n{text[-4000:]}")
        self.account("fulgur_bench (2 independent)", time.time() - t)
        res = [self.load(f"{out}_{model}", 1)[0] for out in outs]
        # One step's compute on one core while the other core is busy too: the limit rows' compute.
        self.independent_steps.setdefault(model, []).append(statistics.mean(r["step_seconds"] for r in res))
        return [r["samples_per_s"] for r in res]

    def run(self, side, model, nproc, warmup, steps, threads=0, extra=()):
        """Runs one side; returns the list of per-rank result dicts."""
        same_malloc = side.endswith(SM)
        base = side[:-len(SM)] if same_malloc else side
        if base in ("ddp", "xla"):
            return self.fulgur(base, [model], nproc, warmup, steps, threads, extra)[model]
        if base in ("lightning_ddp", "lightning_xla"):
            return self.lightning(base[len("lightning_"):], model, nproc, warmup, steps, threads, same_malloc)
        if base == T29:
            return self.python(["eager"], [model], nproc, warmup, steps, threads, extra, same_malloc,
                               self.args.bench_python)[("eager", model)]
        return self.python([base], [model], nproc, warmup, steps, threads, extra, same_malloc)[(base, model)]

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


def lightning_equality(runner, models, procs, steps, lightning_pairs):
    """fulgur against Lightning: the per-rank loss after `steps` steps from the same weights and
    data order. Returns {(lightning side, model, nproc): agreed}; a row that does not agree gets
    no ratio, and the line says why (the losses, the sampler and strategy Lightning used)."""
    rtol = {"lightning_ddp": runner.args.lightning_rtol_ddp, "lightning_xla": runner.args.lightning_rtol_xla}
    ok = {}
    failed = {}  # (lightning side, nproc) -> the model it failed on
    print(f"== equality against Lightning: loss after {steps} steps, same initial weights and data order "
          f"(rtol {rtol['lightning_ddp']:g} DDP, {rtol['lightning_xla']:g} torch_xla)")
    for nproc in procs:
        ours_res = {ours: runner.fulgur(ours, models, nproc, 1, steps - 1) for ours, _ in lightning_pairs}
        for model in models:
            for ours, ref in lightning_pairs:
                if (ref, nproc) in failed:
                    ok[(ref, model, nproc)] = False
                    print(f"  {model:7s} {nproc}p  {ref}: not run, it failed on {failed[(ref, nproc)]} the same way "
                          "before; no ratio for this row")
                    continue
                try:
                    b = runner.run(ref, model, nproc, 1, steps - 1)
                except SystemExit as e:
                    ok[(ref, model, nproc)] = False
                    failed[(ref, nproc)] = model
                    lines = [ln for ln in str(e).splitlines() if not ln.startswith(" ")]
                    print(f"  {model:7s} {nproc}p  {ref}: did not run; no ratio for this row. Its output ends:\n    "
                          + "\n    ".join(lines[-12:]))
                    continue
                a = ours_res[ours][model]
                good_all = len(a) == len(b)
                by_rank = {r["rank"]: r for r in b}
                for ra in a:
                    rb = by_rank.get(ra["rank"])
                    if rb is None:
                        good_all = False
                        print(f"  {model:7s} {nproc}p rank {ra['rank']}  {ref}: no result for this rank")
                        continue
                    la, lb = ra["final_loss"], rb["final_loss"]
                    rel = abs(la - lb) / max(abs(lb), 1e-12)
                    good = rel <= rtol[ref]
                    good_all &= good
                    why = "" if good else (f"  DIFFERENT: no ratio for this row (Lightning: {rb.get('strategy')}, "
                                           f"sampler {rb.get('sampler')}, torch {rb['versions']['torch']})")
                    print(f"  {model:7s} {nproc}p rank {ra['rank']}  fulgur_{ours} {la:.7f}  {ref} {lb:.7f}"
                          f"  rel {rel:.1e}  {'ok' if good else ''}{why}", flush=True)
                ok[(ref, model, nproc)] = good_all
    return ok


def session_processes(sid):
    """Processes still alive in session `sid` (the fault runs start their own session)."""
    left = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] != "Z":
            left.append(f"{d} {cmd[:80]}")
    return left


def fault_table(runner):
    """2 processes, rank 1 raises at the end of step 3: how each system ends, within a timeout."""
    import re
    import signal
    args = runner.args
    model = "mlp"
    rows = []
    cmds = [("fulgur DDPStrategy (cpu)", [args.bin, "--accelerator", "cpu"], "fulgur"),
            ("fulgur XLAStrategy (xla)", [args.bin, "--accelerator", "xla"], "fulgur")]
    if args.lightning:
        script = os.path.join(ROOT, "bench", "lightning_reference.py")
        cmds += [("Lightning DDPStrategy", [args.bench_python, script, "--mode", "ddp"], "lightning"),
                 ("Lightning XLAStrategy (torch_xla)", [args.bench_python, script, "--mode", "xla"], "lightning")]
    print(f"== fault: 2 processes, rank 1 raises at the end of step 3 ({model}); timeout {args.fault_timeout:.0f} s")
    for name, base, kind in cmds:
        runner.n += 1
        out = os.path.join(runner.work, f"r{runner.n}")
        cmd = base + (["--devices", "2"] if kind == "fulgur" else ["--nproc", "2"]) + [
            "--model", model, "--warmup", "200", "--steps", "100", "--data-dir", args.data_dir,
            "--init-dir", runner.work, "--out", out, "--threads", "1", "--fail-rank", "1", "--fail-step", "3"]
        t0 = time.time()
        p = subprocess.Popen(cmd, env=runner.env(2, 1), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True)
        try:
            text, _ = p.communicate(timeout=args.fault_timeout)
            rc, took = p.returncode, time.time() - t0
        except subprocess.TimeoutExpired:
            rc, took = None, time.time() - t0
            os.killpg(p.pid, signal.SIGTERM)
            text, _ = p.communicate()
        try:
            with open(out + ".fault_unix") as f:
                after_fault = t0 + took - float(f.read())  # from the raise to the program's exit
        except (OSError, ValueError):
            after_fault = float("nan")
        time.sleep(1.0)
        left = session_processes(p.pid)
        if left:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        # The injected message itself names neither rank nor step owner: "injected fault at step 3".
        names_exc = "injected fault" in text
        names_rank = re.search(r"rank\W{0,3}1\b|rank 1\b|local_rank=1|ordinal\W{0,3}1\b", text, re.I) is not None
        lines = [ln for ln in text.splitlines() if re.search(r"injected|failed|Error:|exception", ln)]
        lines = lines[:4] + [ln for ln in text.splitlines()[-3:] if ln not in lines[:4]]
        rows.append(dict(name=name, rc=rc, seconds=took, after_fault=after_fault, names_rank=names_rank, names_exc=names_exc,
                         left=len(left), timeout=rc is None, lines=lines[:6]))
        end = "TIMEOUT (killed)" if rc is None else f"exit {rc}"
        print(f"  {name:34s} {end:16s} {took:6.1f} s from start, {after_fault:6.1f} s after the fault  names rank 1: {'yes' if names_rank else 'no'}  "
              f"names the exception: {'yes' if names_exc else 'no'}  processes left: {len(left)}", flush=True)
        for ln in lines:
            print(f"      | {ln[:200]}")
    return rows


def lightning_report(args, models, procs, runner, sps, ratio, startup, recs, lightning_ok, summary, sm_reps):
    print()
    print(f"== against Lightning (issue 17): samples/s end to end (median of {args.reps} paired repetitions; "
          "ratio = median of per-rep ratios)")
    print(f"  {'model':7s} {'procs':>5s}  {'pair':44s} {'fulgur/s':>10s} {'peer/s':>10s} {'ratio':>6s} {'bar':>5s}")
    for model in models:
        for nproc in procs:
            t = max(1, runner.cores // nproc)
            for ours, ref, bar in (("ddp", "lightning_ddp", BAR_LIGHTNING_DDP[model]),
                                   ("xla", "lightning_xla", BAR_LIGHTNING_XLA)):
                if args.skip_lazy and ours == "xla":
                    continue
                if not lightning_ok.get((ref, model, nproc)):
                    print(f"  {model:7s} {nproc:5d}  fulgur_{ours} / {ref:30s} no ratio: the losses did not agree "
                          "or Lightning did not run (see the equality section)")
                    continue
                r = median(ratio[(ours, ref, model, nproc)])
                print(f"  {model:7s} {nproc:5d}  {'fulgur_' + ours + ' / ' + ref:44s} "
                      f"{median(sps[(ours, model, nproc, t)]):10.1f} {median(sps[(ref, model, nproc, t)]):10.1f} "
                      f"{r:6.2f} {bar:5.2f} {'met' if r >= bar else 'NOT MET'}")
                summary[f"speedup_vs_{ref}_{nproc}proc_{model}"] = r
    if args.same_malloc:
        print()
        print("== the same with fulgur's malloc policy on the Python side too "
              f"(GLIBC_TUNABLES={SAME_MALLOC});")
        print(f"   {sm_reps} of the {args.reps} repetitions ran these sides (--same-malloc-reps): the ratio is the median "
              f"of {sm_reps} paired ratio(s), fulgur/s the median of the same repetitions; the summary's "
              "same_malloc_repetitions says how many")
        summary["same_malloc_repetitions"] = sm_reps
        for model in models:
            for nproc in procs:
                t = max(1, runner.cores // nproc)
                for (ours, ref), name in ((("ddp", "eager"), "python_ddp"), (("xla", "lazy"), "python_lazy"),
                                          (("ddp", "lightning_ddp"), "lightning_ddp"),
                                          (("xla", "lightning_xla"), "lightning_xla")):
                    key = (ours, ref + SM, model, nproc)
                    if key not in ratio:
                        continue
                    r = median(ratio[key])
                    print(f"  {model:7s} {nproc:5d}  {'fulgur_' + ours + ' / ' + ref + SM:44s} "
                          f"{median(sps[(ours, model, nproc, t)][:sm_reps]):10.1f} "
                          f"{median(sps[(ref + SM, model, nproc, t)]):10.1f} "
                          f"{r:6.2f}")
                    summary[f"speedup_vs_{name}_{nproc}proc_{model}_same_malloc"] = r
    print()
    print("== where fulgur's lead over Lightning DDP comes from (medians of per-rep ratios of samples/s; the")
    print("   product of the two is fulgur / Lightning): C++ against Python on nearly the same kernels (fulgur on")
    print("   libtorch 2.11 over reference.py on the bench's torch 2.9), and Lightning's Trainer over that plain")
    print("   loop; for reference, torch 2.9's kernels over Debian's 1.13 (reference.py on each)")
    for model in models:
        for nproc in procs:
            if ("ddp", T29, model, nproc) not in ratio or ("ddp", "lightning_ddp", model, nproc) not in ratio:
                continue
            f_e = median(ratio[("ddp", "eager", model, nproc)])
            f_t = median(ratio[("ddp", T29, model, nproc)])
            f_l = median(ratio[("ddp", "lightning_ddp", model, nproc)])
            # fulgur/e13 over fulgur/e29 is e29/e13; fulgur/L over fulgur/e29 is e29/L.
            print(f"  {model:7s} {nproc}p  fulgur/plain(2.9) {f_t:5.2f}  plain(2.9)/Lightning {f_l / f_t:5.2f}  "
                  f"fulgur/Lightning {f_l:5.2f}  (plain(2.9)/plain(1.13) {f_e / f_t:5.2f})")
            summary[f"fulgur_over_plain_torch29_{nproc}proc_{model}"] = f_t
            summary[f"plain_torch29_over_lightning_ddp_{nproc}proc_{model}"] = f_l / f_t
            summary[f"plain_torch29_over_plain_torch113_{nproc}proc_{model}"] = f_e / f_t
    print()
    print("== start-up: from launching the program to the end of the first step (process start, spawn, data,")
    print("   compile), seconds, medians; ratio = median of per-rep fulgur/Lightning, 2 processes; bar 0.5")
    for model in models:
        for nproc in procs:
            t = max(1, runner.cores // nproc)
            for ours, ref in (("ddp", "lightning_ddp"), ("xla", "lightning_xla")):
                if (ref, model, nproc, t) not in recs:
                    continue
                a = median([res[0]["startup_seconds"] for res in recs[(ours, model, nproc, t)]])
                b = median([res[0]["startup_seconds"] for res in recs[(ref, model, nproc, t)]])
                line = f"  {model:7s} {nproc}p  fulgur_{ours} {a:6.2f} s  {ref} {b:6.2f} s"
                if nproc == 2 and (ours, ref, model) in startup:
                    r = median(startup[(ours, ref, model)])
                    line += f"  ratio {r:.3f} {'met' if r <= BAR_STARTUP else 'NOT MET'}"
                    summary[f"startup_vs_{ref}_2proc_{model}"] = r
                print(line)
    print()
    print("== peak resident memory per worker (MiB; max over ranks, median over repetitions) and the loss after")
    print("   the same steps (rank 0, last repetition)")
    for model in models:
        for nproc in procs:
            t = max(1, runner.cores // nproc)
            cells = []
            for side in ("ddp", "lightning_ddp", "xla", "lightning_xla", "eager", "lazy", T29):
                if (side, model, nproc, t) not in recs:
                    continue
                rss = median([max(r["peak_rss_mb"] for r in res) for res in recs[(side, model, nproc, t)]])
                loss = recs[(side, model, nproc, t)][-1][0]["final_loss"]
                cells.append(f"{side} {rss:6.1f} MiB loss {loss:.5f}")
            print(f"  {model:7s} {nproc}p  " + "; ".join(cells))
    print("   (torch_xla on CPU runs its CPU_NUM_DEVICES devices as threads of one process: its 2-device figure is")
    print("    one process's peak)")


def limit_report(models, recs, independent, independent_steps, summary, cores):
    """Issue 35's limit rows: the best 2-process step the machine allows, from the compute time of one
    step on one core (the step of the two independent 1-process 1-thread runs that
    scaling_vs_independent_2proc divides by: each on one core while the other core is busy too; the
    1-process 1-thread run's where there were none) and the raw Gloo all-reduces of the gradient bytes
    measured inside the 2-process run, cut into DDPStrategy's buckets. Without overlap a step costs
    compute + all-reduce; with perfect overlap max(compute + last bucket, all-reduce), as the last
    bucket (the first layers' gradients) exists only when backward ends. The scaling limits are in the
    terms of scaling_vs_independent_2proc (compute / step); the sync limit is the bucketed raw
    all-reduce over the one-buffer one that sync_over_raw_allreduce divides by (what a sync adding
    nothing to its buckets' all-reduces would score). Loopback all-reduce is CPU work ('ar cpu': this
    process's CPU time in it, Gloo's threads included), so on a machine whose cores all compute,
    overlap saves less than the row says."""
    t2 = max(1, cores // 2)
    print()
    print("== limit: 2 processes x 1 thread on this machine (compute: the step of two independent 1-process")
    print("   1-thread runs; all-reduce: raw Gloo in the 2-process run, the gradient bytes cut into DDPStrategy's")
    print("   buckets; step limits without overlap (compute + all-reduce) and with it; medians)")
    print(f"  {'model':7s} {'MiB':>5s} {'bkts':>4s} {'compute':>8s} {'allred':>7s} {'last':>6s} {'ar cpu':>7s} "
          f"{'step 2p: no ovl':>15s} {'ovl':>6s} {'measured':>8s}   scaling limit: {'no ovl':>6s} {'ovl':>5s} "
          f"{'measured':>8s}   sync/raw limit {'measured':>8s}")
    for model in models:
        one = recs.get(("ddp", model, 1, 1))
        two = recs.get(("ddp", model, 2, t2))
        if not (one or model in independent_steps) or not two or "raw_bucketed_allreduce_seconds" not in two[0][0]:
            continue
        c = median(independent_steps[model]) if model in independent_steps else \
            median([res[0]["step_seconds"] for res in one])
        a = median([max(r["raw_bucketed_allreduce_seconds"] for r in res) for res in two])
        last = median([max(r["raw_last_bucket_allreduce_seconds"] for r in res) for res in two])
        a_cpu = median([max(r["raw_bucketed_allreduce_cpu_seconds"] for r in res) for res in two])
        raw = median([max(r["raw_allreduce_seconds"] for r in res) for res in two])
        sync = median([max(r["aligned_sync_seconds"] for r in res) for res in two])
        step2 = median([max(r["step_seconds"] for r in res) for res in two])
        last = min(last, a)  # two medians; the last bucket is part of the whole
        no_ovl, ovl = c + a, max(c + last, a)
        measured = median(independent[model]) if model in independent else float("nan")
        r0 = two[0][0]
        print(f"  {model:7s} {r0['grad_bytes'] / 2**20:5.2f} {r0['buckets']:4d} {c * 1e3:6.2f}ms {a * 1e3:5.2f}ms "
              f"{last * 1e3:4.2f}ms {a_cpu * 1e3:5.2f}ms {no_ovl * 1e3:13.2f}ms {ovl * 1e3:4.2f}ms "
              f"{step2 * 1e3:6.2f}ms                 {c / no_ovl:6.3f} {c / ovl:5.3f} {measured:8.3f}"
              f"              {a / raw:5.2f} {sync / raw:8.2f}")
        summary[f"limit_scaling_2proc_no_overlap_{model}"] = c / no_ovl
        summary[f"limit_scaling_2proc_overlap_{model}"] = c / ovl
        summary[f"limit_sync_over_raw_allreduce_{model}"] = a / raw


def limit_only(args, runner, models):
    """--limit-only: the runs limit_report needs, and nothing else."""
    recs, independent, summary = {}, {}, {}
    t2 = max(1, runner.cores // 2)
    for rep in range(args.reps):
        for model in models:
            steps, warm = max(2, int(STEPS[model] * args.steps_scale)), WARMUP[model]
            two = runner.run("ddp", model, 2, warm, steps, t2, ["--raw-allreduce"])
            recs.setdefault(("ddp", model, 2, t2), []).append(two)
            ind = runner.fulgur_independent(model, warm, steps)
            independent.setdefault(model, []).append(two[0]["samples_per_s"] / sum(ind))
            print(f"  rep {rep + 1} {model:7s} done", flush=True)
    limit_report(models, recs, independent, runner.independent_steps, summary, runner.cores)
    print("== summary")
    for model in models:
        if model in independent:
            summary[f"scaling_vs_independent_2proc_{model}"] = median(independent[model])
    for k, v in summary.items():
        print(f"{k} {v:.3f}")
    return 0


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
    # The fault table trains the MLP whatever --models says.
    runner.init(models + (["mlp"] if (args.fault or args.fault_only) and "mlp" not in models else []))
    t_start = time.time()
    phases = {}  # phase -> wall seconds

    def phase_done(name, since):
        phases[name] = phases.get(name, 0.0) + time.time() - since
        return time.time()

    print(f"machine: {runner.cores} cores; {os.uname().sysname} {os.uname().release}; work folder {work}")
    print(f"OpenBLAS (libtorch 1.13's BLAS: fulgur, reference.py) picks the core '{runner.openblas_detected}' here; "
          + (f"every side runs with OPENBLAS_CORETYPE={runner.openblas_core}" if runner.openblas_core
             else "OPENBLAS_CORETYPE not set") + f" (--openblas-coretype {args.openblas_coretype})")

    if args.fault_only:
        fault_table(runner)
        return 0
    if args.limit_only:
        return limit_only(args, runner, models)
    eq_steps = 3 if args.tiny else args.equality_steps
    t_phase = time.time()
    if not equality(runner, models, procs, eq_steps, args.rtol, pairs):
        print("run.py: the two sides computed different losses; no ratios reported")
        return 1
    lightning_pairs = [("ddp", "lightning_ddp")] + ([] if args.skip_lazy else [("xla", "lightning_xla")])
    lightning_ok = {}
    if args.lightning:
        lightning_ok = lightning_equality(runner, models, procs, eq_steps, lightning_pairs)
    t_phase = phase_done("equality", t_phase)
    if args.equality_only:
        print("equality: ok" if all(lightning_ok.values()) else "equality: ok against the plain references; "
              "see above for Lightning")
        return 0
    if args.fault:
        faults = fault_table(runner)
        t_phase = phase_done("fault table", t_phase)

    # --- throughput: alternate the two sides of each pair -----------------------
    sps = {}    # (side, model, nproc, threads) -> [samples/s per rep]
    ratio = {}  # (ours, ref, model, nproc) -> [ratio per rep]
    startup = {}  # (ours, ref, model) -> [fulgur's start-up over Lightning's, 2 processes, per rep]
    independent = {}  # model -> [fulgur 2-process samples/s over two independent 1-process runs]
    recs = {}   # (side, model, nproc, threads) -> [per-rank results of every rep]
    sm_reps = min(args.reps, args.same_malloc_reps)
    if args.same_malloc and sm_reps < 1:
        raise SystemExit(f"run.py: --same-malloc-reps {args.same_malloc_reps}: with --same-malloc, at least 1 "
                         f"repetition (of --reps {args.reps}) must run the *_same_malloc sides")

    def record(side, model, nproc, threads, res):
        key = (side, model, nproc, threads)
        sps.setdefault(key, []).append(res[0]["samples_per_s"])
        recs.setdefault(key, []).append(res)
        return res[0]["samples_per_s"]

    # Every pair of a cell shares the cell's fulgur run; the sides of a cell run one after
    # the other, in the reverse order every second repetition.
    def cell_pairs(model, nproc, rep):
        out = list(pairs)
        for ours, ref in lightning_pairs:
            if lightning_ok.get((ref, model, nproc)):
                out.append((ours, ref))
        if args.lightning:
            out.append(("ddp", T29))
        if args.same_malloc and rep < sm_reps:
            out += [(ours, ref + SM) for ours, ref in list(out) if ref != T29]
        return out

    for rep in range(args.reps):
        for model in models:
            steps = max(2, int(STEPS[model] * args.steps_scale))
            warm = WARMUP[model]
            for nproc in procs:
                t = max(1, runner.cores // nproc)
                cps = cell_pairs(model, nproc, rep)
                order = []
                for ours in ("ddp", "xla"):
                    for o, ref in cps:
                        if o == ours:
                            order += [x for x in (o, ref) if x not in order]
                if rep % 2:
                    order.reverse()
                got = {}
                for side in order:
                    extra = ["--raw-allreduce"] if side in ("ddp", "eager") and nproc > 1 else []
                    res = runner.run(side, model, nproc, warm, steps, t, extra)
                    got[side] = record(side, model, nproc, t, res)
                for ours, ref in cps:
                    ratio.setdefault((ours, ref, model, nproc), []).append(got[ours] / got[ref])
                    print(f"  rep {rep + 1} {model:7s} {nproc}p  fulgur_{ours} {got[ours]:9.1f}/s  "
                          f"{ref:26s} {got[ref]:9.1f}/s  ratio {got[ours] / got[ref]:.2f}", flush=True)
                if nproc == 2:
                    for ours, ref in cps:
                        if ref.startswith("lightning") and not ref.endswith(SM):
                            a = recs[(ours, model, 2, t)][-1][0]["startup_seconds"]
                            b = recs[(ref, model, 2, t)][-1][0]["startup_seconds"]
                            startup.setdefault((ours, ref, model), []).append(a / b)
            if 1 in procs and 2 in procs:
                # Scaling: 1 process with one thread, against the 2-process run above.
                record("ddp", model, 1, 1, runner.run("ddp", model, 1, warm, steps, 1))
                # ... and two independent 1-process runs started together (the machine's own limit).
                ind = runner.fulgur_independent(model, warm, steps)
                two = sps[("ddp", model, 2, 1)][-1]
                independent.setdefault(model, []).append(two / sum(ind))
                print(f"  rep {rep + 1} {model:7s} fulgur_ddp 2p {two:9.1f}/s  two independent 1p runs "
                      f"{ind[0]:.1f} + {ind[1]:.1f}/s  ratio {two / sum(ind):.2f}", flush=True)

    t_phase = phase_done("throughput repetitions", t_phase)
    if args.dump:
        with open(args.dump, "w") as f:
            json.dump({"sps": {"|".join(map(str, k)): v for k, v in sps.items()},
                       "ratio": {"|".join(map(str, k)): v for k, v in ratio.items()},
                       "startup": {"|".join(map(str, k)): v for k, v in startup.items()},
                       "independent": independent,
                       "recs": {"|".join(map(str, k)): v for k, v in recs.items()}}, f)

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
        t_phase = phase_done("memory across epochs", t_phase)

    # --- report --------------------------------------------------------------------
    summary = {}
    print()
    print(f"== samples/s end to end (median of {args.reps} paired repetitions; ratio = median of per-rep ratios)")
    print(f"  {'model':7s} {'procs':>5s}  {'pair':22s} {'fulgur/s':>10s} {'python/s':>10s} {'ratio':>6s} {'bar':>5s}")
    for model in models:
        for nproc in procs:
            t = max(1, runner.cores // nproc)
            for ours, ref in pairs:
                r = median(ratio[(ours, ref, model, nproc)])
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

    if args.lightning:
        lightning_report(args, models, procs, runner, sps, ratio, startup, recs, lightning_ok, summary, sm_reps)
    if independent:
        print()
        print("== scaling against the machine's own limit: fulgur DDP 2 processes x 1 thread, over two independent")
        print("   1-process 1-thread runs started at the same time (samples/s; median of per-rep ratios; bar 0.95)")
        for model, xs in independent.items():
            r = median(xs)
            print(f"  {model:7s} {r:.3f}  (per rep: {' '.join(f'{x:.2f}' for x in xs)})  "
                  f"{'met' if r >= 0.95 else 'NOT MET'}")
            summary[f"scaling_vs_independent_2proc_{model}"] = r
    if 1 in procs and 2 in procs:
        limit_report(models, recs, independent, runner.independent_steps, summary, runner.cores)
    backends = sorted({r.get("xla_backend", "?") for (s_, m, n, t), v in recs.items() if s_ == "xla"
                       for res in v for r in res})
    if backends:
        print(f"fulgur's xla side ran on the backend(s): {', '.join(backends)} "
              f"(FULGUR_XLA_BACKEND={os.environ.get('FULGUR_XLA_BACKEND', '<unset>')})")
    if args.fault:
        print()
        print("== fault: 2 processes, rank 1 raises at the end of step 3 (repeated from the start of the run)")
        print(f"  {'system':34s} {'end':16s} {'from start':>10s} {'after fault':>11s}  {'names rank':10s} "
              f"{'names exc':9s} {'left':>4s}")
        for r in faults:
            end = "TIMEOUT (killed)" if r["timeout"] else f"exit {r['rc']}"
            print(f"  {r['name']:34s} {end:16s} {r['seconds']:8.1f} s {r['after_fault']:9.1f} s  "
                  f"{'yes' if r['names_rank'] else 'no':10s} "
                  f"{'yes' if r['names_exc'] else 'no':9s} {r['left']:4d}")

    print()
    print(f"total time {time.time() - t_start:.0f} s")
    print("  by phase: " + ", ".join(f"{k} {v:.0f} s" for k, v in phases.items()))
    print("  by program: " + ", ".join(f"{k} {v:.0f} s" for k, v in sorted(runner.spent.items(), key=lambda kv: -kv[1])))
    print("== summary")
    for k, v in summary.items():
        if isinstance(v, int):
            print(f"{k} {v}")
        else:
            print(f"{k} {v:.3f}" if not k.startswith("peak_rss") else f"{k} {v:.1f}")
    if not args.keep:
        subprocess.run(["rm", "-rf", work])
    return 0


if __name__ == "__main__":
    sys.exit(main())
