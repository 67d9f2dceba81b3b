#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""fulgur's xla device on PJRT against the TorchScript lazy backend and the eager cpu step (issue 12).

For each model (MNIST MLP, MNIST CNN, character transformer), fulgur_bench trains from the same
initial weights on the same data and batch, once per side:
  pjrt   --accelerator xla, FULGUR_XLA_BACKEND=pjrt (graphs compiled by the XLA CPU plugin)
  ts     --accelerator xla, FULGUR_XLA_BACKEND=ts   (graphs run by the TorchScript interpreter)
  cpu    --accelerator cpu                          (eager libtorch)
Each repetition runs the three sides of a model back to back, the order rotating between
repetitions. Reported per model: the median step time of each side, the pjrt/eager and pjrt/ts
ratios paired within a repetition (median, then each), compile time per graph (pjrt: emission +
PJRT compile per XLA graph; ts: wall time of the step marks that compiled, execution included,
per graph), graphs compiled, peak RSS (the largest worker's VmHWM) and the last loss.
  bench/xla_backends.py                          # 3 repetitions, about 3 minutes
  bench/xla_backends.py --reps 5 --sides pjrt,cpu
  XLA_FLAGS=... bench/xla_backends.py --sides pjrt,cpu   # the plugin's flags reach the pjrt side
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
# Timed steps after the warm-up (which holds every compile: graphs stop after step 4). About a
# second or more per side: with 200 MLP steps (0.2 s) single tables of the same build read its
# pjrt/eager ratio anywhere in 1.05-1.28 (bench/history/libtorch-1.13.md, session 15).
STEPS = {"mlp": 800, "cnn": 240, "charlm": 80}
WARMUP = {"mlp": 10, "cnn": 8, "charlm": 6}
SIDES = ["pjrt", "ts", "cpu"]


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bin", default=os.path.join(ROOT, "build", "bin", "fulgur_bench"))
    p.add_argument("--python", default="/usr/bin/python3", help="the interpreter with Debian's python3-torch")
    p.add_argument("--data-dir", default=os.path.join(ROOT, "data"))
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--sides", default=",".join(SIDES))
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--steps-scale", type=float, default=1.0)
    p.add_argument("--devices", type=int, default=1, help="processes per side (xla: XLAStrategy, cpu: DDP)")
    p.add_argument("--work", default="", help="folder for weights and results (default: a new temporary one)")
    return p.parse_args()


def run_side(args, work, side, model, rep):
    steps = max(3, int(STEPS[model] * args.steps_scale))
    out = os.path.join(work, f"r{rep}-{side}")
    # The thread environment bench/run.py gives every side (fulgur's launcher's policy): the cores
    # split between the processes, a passive OpenMP wait. Without it the eager step ran 2-5x slower
    # (spinning threads) and the pjrt/eager ratio read far better than it is.
    threads = max(1, len(os.sched_getaffinity(0)) // args.devices)
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads), OMP_WAIT_POLICY="PASSIVE")
    if side != "cpu":
        env["FULGUR_XLA_BACKEND"] = side
    # Every run compiles its graphs, so that "compile per graph" stays a compile time (the compile
    # cache would make later repetitions load the first's programs).
    env["FULGUR_XLA_CACHE_DIR"] = "off"
    cmd = [args.bin, "--model", model, "--accelerator", "cpu" if side == "cpu" else "xla",
           "--devices", str(args.devices), "--threads", str(threads), "--warmup", str(WARMUP[model]), "--steps", str(steps),
           "--data-dir", args.data_dir, "--init-dir", work, "--out", out]
    t0 = time.time()
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
    ranks = []
    for r in range(args.devices):
        with open(f"{out}_{model}.{r}.json") as f:
            ranks.append(json.load(f))
    res = dict(ranks[0])
    res["peak_rss_mb"] = max(x["peak_rss_mb"] for x in ranks)
    res["wall_seconds"] = time.time() - t0
    return res


def compile_per_graph(res, side):
    if side == "pjrt" and res.get("xla_graphs_compiled"):
        return res["xla_compile_seconds"] / res["xla_graphs_compiled"]
    if side == "ts" and res.get("graphs_compiled"):
        return res["compile_step_seconds"] / res["graphs_compiled"]
    return None


def fmt_ms(s):
    return f"{s * 1e3:.1f} ms"


def main():
    args = parse_args()
    models = args.models.split(",")
    sides = args.sides.split(",")
    work = args.work or tempfile.mkdtemp(prefix="fulgur-xla-backends-")
    os.makedirs(work, exist_ok=True)
    subprocess.run([args.python, os.path.join(ROOT, "bench", "reference.py"), "--mode", "init", "--model",
                    ",".join(models), "--data-dir", args.data_dir, "--init-dir", work], check=True)
    start = time.time()
    with open("/proc/loadavg") as f:
        load_start = f.read().split()[0]
    results = {m: {s: [] for s in sides} for m in models}
    for rep in range(args.reps):
        for m in models:
            order = sides[rep % len(sides):] + sides[:rep % len(sides)]
            for s in order:
                r = run_side(args, work, s, m, rep)
                results[m][s].append(r)
                print(f"rep {rep + 1} {m} {s}: {fmt_ms(r['step_seconds'])}/step, loss {r['final_loss']:.5f}, "
                      f"peak RSS {r['peak_rss_mb']:.0f} MB", file=sys.stderr, flush=True)
    with open("/proc/loadavg") as f:
        load_end = f.read().split()[0]

    print(f"\n{args.reps} repetitions, {args.devices} process(es) per side, {time.time() - start:.0f} s, "
          f"load {load_start} at the start, {load_end} at the end; results in {work}\n")
    head = "| model | " + " | ".join(sides)
    ratios = [(a, b) for a, b in (("pjrt", "cpu"), ("pjrt", "ts")) if a in sides and b in sides]
    head += "".join(f" | {a} / {'eager' if b == 'cpu' else b}" for a, b in ratios)
    head += " | compile per graph " + " / ".join(s for s in sides if s != "cpu")
    head += " | graphs | peak RSS " + " / ".join(sides) + " | loss |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    summary = []
    for m in models:
        step = {s: statistics.median(r["step_seconds"] for r in results[m][s]) for s in sides}
        cells = [m] + [fmt_ms(step[s]) for s in sides]
        for a, b in ratios:
            each = [x["step_seconds"] / y["step_seconds"] for x, y in zip(results[m][a], results[m][b])]
            cells.append(f"**{statistics.median(each):.2f}** (" + ", ".join(f"{e:.2f}" for e in each) + ")")
            summary.append(f"{m}_{a}_over_{b} {statistics.median(each):.3f}")
        comp = []
        for s in sides:
            if s == "cpu":
                continue
            per = [c for c in (compile_per_graph(r, s) for r in results[m][s]) if c is not None]
            comp.append(f"{statistics.median(per):.2f} s" if per else "-")
        cells.append(" / ".join(comp))
        graphs = [str(results[m][s][0].get("xla_graphs_compiled" if s == "pjrt" else "graphs_compiled", "-"))
                  for s in sides if s != "cpu"]
        cells.append(" / ".join(graphs))
        cells.append(" / ".join(f"{statistics.median(r['peak_rss_mb'] for r in results[m][s]):.0f}" for s in sides)
                     + " MB")
        cells.append(" / ".join(f"{results[m][s][-1]['final_loss']:.5f}" for s in sides))
        print("| " + " | ".join(cells) + " |")
        for s in sides:
            summary.append(f"{m}_{s}_step_ms {step[s] * 1e3:.2f}")
    print("\n" + "\n".join(summary))


if __name__ == "__main__":
    main()
