#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The model zoo on xla against eager, and its compile times with and without the compile cache (issue 33).

Each repetition runs build/bin/zoo_bench twice on one fresh compile cache folder
(FULGUR_XLA_CACHE_DIR): the first run compiles every graph and writes the cache, the second
finds them there. zoo_bench fits each zoo model 20 steps on cpu and then on xla in one process
(bench/zoo_bench.cpp). Reported per model, medians over the repetitions (and both runs for the
step times):
  eager ms, xla ms   the median step interval after warm-up, tracing and compiling included
  xla / eager        the ratio paired within one run
  graphs             XLA graphs compiled by one xla fit
  compile s/graph    the first run's xla compile seconds (StableHLO emission + PJRT compile) per graph
  cached s/graph     the second run's (emission + loading the cache entry) per graph
  cached / first     the second run's compile seconds over the first's (issue 33's goal: < 0.10)
  hits               cache hits of the second run's xla fit
XLA_FLAGS is --xla_cpu_experimental_xnn_fusion_type= unless set: the CPU plugin cannot serialize
its XNNPACK fusions, so with them on nothing is cached (bench/RESULTS.md, the compile cache).
  bench/zoo_bench.py                 # 3 repetitions, all models
  bench/zoo_bench.py --reps 5 gpt cnn
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(binary, models, cache, env):
    e = dict(env, FULGUR_XLA_CACHE_DIR=cache)
    out = subprocess.run([binary] + models, env=e, check=True, capture_output=True, text=True).stdout
    rows = {}
    for line in out.splitlines():
        f = line.split("\t")
        if len(f) != 7:
            continue
        rows[f[0]] = {"eager": float(f[1]), "xla": float(f[2]), "graphs": int(f[3]), "compile": float(f[4]),
                      "compiles": int(f[5]), "hits": int(f[6])}
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bin", default=os.path.join(ROOT, "build", "bin", "zoo_bench"))
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("models", nargs="*", help="zoo_bench's model names; all when none")
    a = p.parse_args()
    env = dict(os.environ)
    env.setdefault("XLA_FLAGS", "--xla_cpu_experimental_xnn_fusion_type=")
    runs = []  # (first, second) per repetition
    for rep in range(a.reps):
        with tempfile.TemporaryDirectory(prefix="zoo_cache_") as cache:
            first = run(a.bin, a.models, cache, env)
            second = run(a.bin, a.models, cache, env)
        runs.append((first, second))
        print(f"repetition {rep + 1}/{a.reps} done", file=sys.stderr)
    med = statistics.median
    print(f"XLA_FLAGS={env['XLA_FLAGS']!r}, {a.reps} repetitions")
    print("| model | eager ms | xla ms | xla / eager | graphs | compile s/graph | cached s/graph | cached / first | hits |")
    print("|---|---|---|---|---|---|---|---|---|")
    for model in runs[0][0]:
        both = [r[model] for pair in runs for r in pair]
        firsts = [pair[0][model] for pair in runs]
        seconds = [pair[1][model] for pair in runs]
        graphs = firsts[0]["graphs"]
        compile_first = med(r["compile"] for r in firsts)
        compile_second = med(r["compile"] for r in seconds)
        ratio = med(s["compile"] / f["compile"] for f, s in zip(firsts, seconds))
        print(f"| {model} | {med(r['eager'] for r in both):.2f} | {med(r['xla'] for r in both):.2f} | "
              f"{med(r['xla'] / r['eager'] for r in both):.2f} | {graphs} | {compile_first / graphs:.3f} | "
              f"{compile_second / graphs:.3f} | {ratio:.3f} | {min(r['hits'] for r in seconds)}/{graphs} |")


if __name__ == "__main__":
    main()
