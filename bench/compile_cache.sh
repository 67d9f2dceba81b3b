#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The XLA compile cache (src/xla/pjrt/compile_cache.h): the MNIST example on one xla device, run
# twice with one --default-root-dir, so that the second run finds the first's programs in
# <root>/.xla_cache. Prints, per model and XLA_FLAGS setting, each run's PJRT compiles, cache
# hits, "xla compile seconds" (StableHLO emission and PJRT compile or cache load; fit and test
# stages summed, from the xla_debug metrics report) and wall seconds.
#
#   bench/compile_cache.sh [build dir, default build] [steps, default 30]
set -euo pipefail
build=${1:-build}
steps=${2:-30}
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
mnist="$build/bin/mnist"
data="$(dirname "$0")/../data/mnist"
echo "| model | XLA_FLAGS | run | PJRT compiles | cache hits | xla compile s | wall s |"
echo "|---|---|---|---|---|---|---|"
for model in mlp cnn; do
  for flags in "" "--xla_cpu_experimental_xnn_fusion_type="; do
    dir="$root/$model${flags:+-noxnn}"
    label=${flags:-unset (fulgur adds XNNPACK reductions)}
    for run in 1 2; do
      start=$(date +%s.%N)
      out=$(XLA_FLAGS="$flags" "$mnist" --model "$model" --accelerator xla --devices 1 --strategy xla_debug \
        --max-steps "$steps" --limit-train-batches "$steps" --default-root-dir "$dir" --data-dir "$data" 2>&1)
      end=$(date +%s.%N)
      echo "$out" | awk -v model="$model" -v flags="$label" -v run="$run" \
        -v start="$start" -v end="$end" '
        /PJRT compiles:/ { compiles += $3 }
        /xla compile seconds:/ { seconds += $4 }
        /hits [0-9]+, misses/ { sub(",", "", $2); hits += $2 }
        END { printf "| %s | %s | %s | %d | %d | %.3f | %.1f |\n", model, flags, run, compiles, hits, seconds, end - start }'
    done
  done
done
