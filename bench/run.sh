#!/bin/sh
# `make bench`: fulgur against the plain PyTorch references. Arguments go to
# bench/run.py (e.g. --reps 1 --steps-scale 0.3 for a quick look).
set -e
cd "$(dirname "$0")/.."
exec /usr/bin/python3 bench/run.py "$@"
