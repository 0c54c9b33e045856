"""Evaluation of trained models on long-context benchmarks: one engine (generation for
prompts of any length with stop rules, a grid of resumable cells, progress, W&B) and one
module per benchmark on it (the NIAH table, RULER, InfiniteBench) plus the lm-evaluation-
harness adapter. Sits above model, data and
model_tokenizer, below train (the in-training probe reads it) and cli. The generic pieces:
generation.py (the one decoder), cells.py and task.py (the grid), model_setup.py (device,
precision, position method, memory check: memory_estimate.py), prompt_frame.py (BOS and
chat turns), stats.py (Wilson intervals), effective_length.py (the search over lengths),
cell_progress.py (a bar per cell). The benchmarks: niah/, ruler/, infinitebench.py, with
benchmark_tasks.py and suite_table.py (`longctx eval-suite`) over them; lm_eval.py."""
