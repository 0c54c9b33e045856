"""Weights & Biases through Lightning's WandbLogger, offline unless a key is configured.

`log.wandb_mode=auto` goes online only when an API key is available (WANDB_API_KEY or a
`~/.netrc` entry for api.wandb.ai; longctx/wandb_mode.py); otherwise the run is written offline under
`<out_dir>/wandb/` and can be uploaded later with `wandb sync`. W&B never prompts.
"""

from __future__ import annotations

import os
from pathlib import Path

from lightning.pytorch.loggers import WandbLogger

from longctx.config import ExperimentConfig
from longctx.wandb_mode import resolve_wandb_mode


def make_wandb_logger(config: ExperimentConfig, **init_args) -> WandbLogger | None:
    """Lightning's WandbLogger for this run; `init_args` (from `log.loggers`) override the
    defaults. The config is logged once, by the trainer's LogConfig callback (train/loggers.py)."""
    mode = resolve_wandb_mode(config.log.wandb_mode)
    if mode == "disabled":
        return None
    os.environ.setdefault("WANDB_SILENT", "true")
    os.environ["WANDB_MODE"] = mode  # also read by W&B child processes
    save_dir = Path(config.train.out_dir)
    save_dir.mkdir(parents=True, exist_ok=True)
    defaults = {
        "project": config.log.project,
        "name": config.log.run_name or None,
        "save_dir": str(save_dir),
        "offline": mode == "offline",
        "log_model": False,
    }
    return WandbLogger(**{**defaults, **init_args})
