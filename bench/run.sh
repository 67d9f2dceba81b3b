#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# `make bench`: fulgur against the plain PyTorch references (Debian's python3-torch) and
# against Lightning's Trainer with DDP and Lightning on torch_xla (issue 17; the bench
# environment .venv/bench is made once by scripts/install-bench-env, then reused).
# Arguments go to bench/run.py (e.g. --reps 1 --steps-scale 0.3 for a quick look).
# FULGUR_XLA_BACKEND (ts, pjrt, eager) passes through to fulgur's xla side.
set -e
cd "$(dirname "$0")/.."
scripts/install-bench-env
exec /usr/bin/python3 bench/run.py --lightning --same-malloc --fault "$@"
