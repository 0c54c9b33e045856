"""Evaluation of trained models on long-context benchmarks: one engine (a grid of resumable cells, progress, W&B) and one
folder per benchmark on it (NIAH, RULER, InfiniteBench), found through one registry, plus
the lm-evaluation-harness adapter. Sits above model, data and model_tokenizer, below train
(the in-training probe reads it) and cli.

The generic pieces (decoding itself is longctx.model.inference.generation): cells.py and task.py (the grid),
model_setup.py (device, precision, position method, memory check: memory_estimate.py),
prompt_frame.py (BOS and chat turns), prompt_pieces.py (prompts assembled in token space),
essays.py (the essay haystack text), errors.py (what any task raises), stats.py (Wilson
intervals, averages over lengths), effective_length.py (the search over lengths),
cell_progress.py (a bar per cell), predictions.py (prediction files), suite_table.py
(`longctx eval-suite` over any benchmark); lm_eval.py.

The benchmarks: registry.py (one spec per benchmark: the folder shape, the lookups every
command uses) and a folder each, niah/, ruler/, infinitebench/; none imports another's, and
no generic piece imports one."""
