"""Evaluation of trained models on long-context benchmarks: one engine (generation for
prompts of any length with stop rules, a grid of resumable cells, progress, W&B) and one
module per benchmark on it (the NIAH table, RULER, InfiniteBench) plus the lm-evaluation-
harness adapter. Sits above model, data, niah and model_tokenizer; below cli."""
