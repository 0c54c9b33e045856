#!/bin/bash
# CPU smoke of the GPU step checkpoints-2025 (tools/gpu/gpu_steps.toml): its command with the
# model at the CPU path, n = 1 and 2,048 tokens; {out} = $1, {resume} = $2 (empty, then
# "--resume-from <the first call's cells.tar.xz>": the second call skipped every cell, 28 s).
# First call: 273 s wall for the five arms (2 shared cores, OMP_NUM_THREADS=1).
cd "$(dirname "$0")/../../.."
export OMP_NUM_THREADS=1 PYTHONPATH=$PWD/src WANDB_MODE=disabled
M=$HOME/.cache/longctx/hf/gemma3-270m
out=$1
rm -rf runs/gemma3_gpu
set -- $2; mkdir -p runs/gemma3_gpu && { test -z "$2" || tar -xJf "$2" -C runs/gemma3_gpu; }
timeout 500 python -m longctx eval-suite $M experiments/real/gemma3_ruler_gpu.yaml eval.benchmarks.samples_per_length=1 \
    --suite ruler --tasks niah_single_2 --lengths 2048 --cells runs/gemma3_gpu/cells --out $out/gemma3_ruler.md --quiet
code=$?
tar -cJf $out/cells.tar.xz -C runs/gemma3_gpu cells
exit $code
