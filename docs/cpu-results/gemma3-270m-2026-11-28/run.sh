#!/bin/bash
# Resumable: every cell is kept under /work/runs/gemma3/cells*; rerunning this script reuses them.
# RULER niah_single_2 (one needle, RULER's prompt and scoring), rows of a length decoded together
# (eval.niah.batch_tokens=65536: decoding's cost per step barely grows with rows on CPU).
set -x
cd /work/wt-i53-gemma
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONPATH=/work/wt-i53-gemma/src
PY=/work/main/.venv/bin/python
D=$HOME/.cache/longctx/hf/gemma3-270m
R=/work/runs/gemma3
B=eval.niah.batch_tokens=65536
date
$PY -m longctx eval-suite $D $R/ruler_rope_only.yaml $B --suite ruler --tasks niah_single_2 --lengths 8192 --out $R/table/ruler_8192.md --cells $R/cells_ruler --quiet
date
$PY -m longctx eval-suite $D experiments/real/gemma3_ruler.yaml $B --suite ruler --tasks niah_single_2 --lengths 16384 --out $R/table/ruler_16384.md --cells $R/cells_ruler --quiet
date
$PY -m longctx eval-suite $D experiments/real/gemma3_ruler.yaml $B eval.benchmarks.samples_per_length=2 --suite ruler --tasks niah_single_2 --lengths 32768 --out $R/table/ruler_32768.md --cells $R/cells_ruler --quiet
date
