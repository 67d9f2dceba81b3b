#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""fulgur against Lightning on one NVIDIA GPU (scripts/device-check runs it).

For each model (MNIST CNN, charlm) the same initial weights (reference.py --mode
init), the same data order, batch and steps start three programs on the GPU:
  fulgur_cuda     build/bin/fulgur_bench --accelerator cuda (SingleDeviceStrategy)
  lightning_cuda  bench/lightning_reference.py --mode cuda (Lightning 2.x, accelerator="gpu")
  fulgur_xla      fulgur_bench --accelerator xla with PJRT_DEVICE=CUDA (the PJRT CUDA plugin)
Equality first: the final losses of the sides are printed side by side. Then
paired runs (fulgur_cuda and lightning_cuda alternate, --pairs times), and the
median ratio of samples/s over the pairs. While each fulgur run trains,
nvidia-smi samples the GPU's utilisation (the mean is printed: how far from
busy the device is). Prints a markdown table and writes <out>/gpu_bench.json.

  python3 bench/gpu_bench.py --build /tmp/fulgur-build --out $OUT --pairs 3
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def run(cmd, env=None, log=None, sample_gpu=False):
    start = time.time()
    smi = None
    if sample_gpu:
        smi = subprocess.Popen(["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits",
                                "-lms", "100"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    with open(log, "a") if log else open(os.devnull, "w") as out:
        out.write("$ " + " ".join(cmd) + "\n")
        out.flush()
        rc = subprocess.run(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=300).returncode
    util = None
    if smi:
        smi.terminate()
        text, _ = smi.communicate()
        values = [int(v) for v in text.split() if v.isdigit()]
        util = statistics.mean(values) if values else None
    return rc, time.time() - start, util


def read(prefix, side_mode, model):
    path = f"{prefix}_{side_mode}_{model}.0.json" if side_mode else f"{prefix}_{model}.0.json"
    with open(path) as f:
        return json.load(f)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--models", default="cnn,charlm")
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--xla-plugin", default="", help="the PJRT CUDA plugin file ('' skips fulgur_xla)")
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    log = os.path.join(a.out, "gpu_bench.log")
    init = os.path.join(a.out, "init")
    os.makedirs(init, exist_ok=True)
    data = os.path.join(ROOT, "data")
    subprocess.run([sys.executable, os.path.join(HERE, "reference.py"), "--mode", "init", "--model", a.models,
                    "--data-dir", data, "--init-dir", init], check=True)
    bench = os.path.join(a.build, "bin", "fulgur_bench")
    common = ["--data-dir", data, "--init-dir", init, "--warmup", str(a.warmup), "--steps", str(a.steps)]
    results = {}
    for model in a.models.split(","):
        rows = {"fulgur_cuda": [], "lightning_cuda": [], "fulgur_xla": []}
        utils = {"fulgur_cuda": [], "lightning_cuda": [], "fulgur_xla": []}
        for i in range(a.pairs):
            order = ["fulgur_cuda", "lightning_cuda"] if i % 2 == 0 else ["lightning_cuda", "fulgur_cuda"]
            for side in order:
                prefix = os.path.join(a.out, f"r{i}")
                if side == "fulgur_cuda":
                    cmd = [bench, "--model", model, "--accelerator", "cuda", "--devices", "1", "--out", prefix] + common
                    rc, secs, util = run(cmd, log=log, sample_gpu=True)
                    res = read(prefix, "", model) if rc == 0 else None
                else:
                    cmd = [sys.executable, os.path.join(HERE, "lightning_reference.py"), "--mode", "cuda", "--model",
                           model, "--out", prefix] + common
                    rc, secs, util = run(cmd, log=log, sample_gpu=True)
                    res = read(prefix, "cuda", model) if rc == 0 else None
                print(f"{model} pair {i} {side}: rc {rc}, {secs:.1f} s wall, "
                      + (f"{res['samples_per_s']:.0f} samples/s, final loss {res['final_loss']:.6f}, GPU busy {util}"
                         if res else "FAILED (see gpu_bench.log)"), flush=True)
                if res:
                    rows[side].append(res)
                    utils[side].append(util)
        if a.xla_plugin:
            # Compiled each run (no compile cache), as the earlier figures were.
            env = dict(os.environ, PJRT_DEVICE="CUDA", PJRT_LIBRARY_PATH=a.xla_plugin, FULGUR_XLA_CACHE_DIR="off")
            prefix = os.path.join(a.out, "x")
            cmd = [bench, "--model", model, "--accelerator", "xla", "--devices", "1", "--out", prefix] + common
            rc, secs, util = run(cmd, env=env, log=log, sample_gpu=True)
            res = read(prefix, "", model) if rc == 0 else None
            print(f"{model} fulgur_xla (PJRT CUDA): rc {rc}, {secs:.1f} s wall, "
                  + (f"{res['samples_per_s']:.0f} samples/s, final loss {res['final_loss']:.6f}, GPU busy {util}, "
                     f"graphs {res.get('graphs_compiled')}" if res else "FAILED (see gpu_bench.log)"), flush=True)
            if res:
                rows["fulgur_xla"].append(res)
                utils["fulgur_xla"].append(util)
        summary = {}
        for side, rs in rows.items():
            if rs:
                summary[side] = {"samples_per_s": statistics.median(r["samples_per_s"] for r in rs),
                                 "final_loss": rs[0]["final_loss"],
                                 "gpu_busy_pct": statistics.mean(u for u in utils[side] if u is not None)
                                 if any(u is not None for u in utils[side]) else None}
        pairs = [f["samples_per_s"] / l["samples_per_s"] for f, l in zip(rows["fulgur_cuda"], rows["lightning_cuda"])]
        if pairs:
            summary["fulgur_cuda_over_lightning_cuda"] = statistics.median(pairs)
            summary["pair_ratios"] = pairs
        if "fulgur_xla" in summary and "fulgur_cuda" in summary:
            summary["fulgur_xla_over_fulgur_cuda"] = summary["fulgur_xla"]["samples_per_s"] / summary["fulgur_cuda"]["samples_per_s"]
        results[model] = summary
    with open(os.path.join(a.out, "gpu_bench.json"), "w") as f:
        json.dump(results, f, indent=1)
    print("\n| model | fulgur cuda samples/s | Lightning cuda samples/s | fulgur/Lightning (median of pairs) "
          "| fulgur xla (PJRT CUDA) samples/s | xla/cuda | final loss fulgur / Lightning / xla | GPU busy % fulgur / Lightning |")
    print("|---|---|---|---|---|---|---|---|")
    for model, s in results.items():
        g = lambda side, key: s.get(side, {}).get(key)
        fmt = lambda v, spec: format(v, spec) if isinstance(v, (int, float)) else "-"
        print(f"| {model} | {fmt(g('fulgur_cuda', 'samples_per_s'), '.0f')} | {fmt(g('lightning_cuda', 'samples_per_s'), '.0f')} "
              f"| {fmt(s.get('fulgur_cuda_over_lightning_cuda'), '.2f')} | {fmt(g('fulgur_xla', 'samples_per_s'), '.0f')} "
              f"| {fmt(s.get('fulgur_xla_over_fulgur_cuda'), '.2f')} "
              f"| {fmt(g('fulgur_cuda', 'final_loss'), '.5f')} / {fmt(g('lightning_cuda', 'final_loss'), '.5f')} / "
              f"{fmt(g('fulgur_xla', 'final_loss'), '.5f')} "
              f"| {fmt(g('fulgur_cuda', 'gpu_busy_pct'), '.0f')} / {fmt(g('lightning_cuda', 'gpu_busy_pct'), '.0f')} |")


if __name__ == "__main__":
    main()
