"""Evaluation of trained models on long-context benchmarks: one engine (generation for
prompts of any length with stop rules, a grid of resumable cells, progress, W&B) and one
module per benchmark on it (the NIAH table, RULER, InfiniteBench) plus the lm-evaluation-
harness adapter. Sits above model, data and
model_tokenizer, below train (the in-training probe reads it) and cli. The generic pieces:
`generation` (the one decoder), `cells` and `task` (the grid), `runtime` (device,
precision, position method, memory check: `memory`), `prompt_frame` (BOS and chat
turns), `stats` (Wilson intervals), `effective_length` (the search over lengths),
`progress`."""
