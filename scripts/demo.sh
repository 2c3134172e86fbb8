#!/usr/bin/env bash
# The quick start: builds gpuheap (through setup.sh), profiles the bundled example training
# loop (on the GPU when there is one, else on the simulated CUDA runtime) and prints its
# summary.   scripts/demo.sh [mini_train args: steps layers width]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
sim=--simulate
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then sim=""; fi
out=$(mktemp -d)/demo.%p.trace
build/gpuheap run $sim -o "$out" -- build/examples/mini_train "$@"
build/gpuheap summary "$(dirname "$out")"/demo.*.trace.zst   # run compresses at exit
