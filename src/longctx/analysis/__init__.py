"""Loaders and plots used by the notebooks in analysis/ (docs/design.md §12).

runs.py (training history as a tidy frame), fi.py (f(i) snapshots), niah.py (NIAH results),
tables.py (the figures' data), figures.py (the plots), wandb_offline.py (offline W&B reader).
"""
