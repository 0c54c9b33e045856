"""Loaders and plots used by the notebooks in analysis/ (docs/design.md §12).

runs.py (training history as a tidy frame), fi.py (f(i) snapshots), niah_results.py (NIAH
results), tables.py (the figures' data), figures.py (the plots), paired.py (two pass rates on
the same prompts, Newcombe's interval), extension.py (context-extension runs side by side),
wandb_offline.py (offline W&B reader).
"""
