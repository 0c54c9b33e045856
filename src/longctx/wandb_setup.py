"""Weights & Biases, set up in one place: whether a run goes online, the Lightning logger of
training, the run of an evaluation, and the shutdown that leaves complete files behind.

`log.wandb_mode=auto` goes online only when an API key is available (WANDB_API_KEY or a
`~/.netrc` entry for api.wandb.ai), so W&B never prompts for a login and offline is the
default: the run is written under `<out_dir>/wandb/` and can be uploaded later with
`wandb sync`. wandb and Lightning are imported inside the functions, so importing this
module costs nothing (`longctx config` stays light).
"""

from __future__ import annotations

import netrc
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from longctx.config import ExperimentConfig, as_dict

if TYPE_CHECKING:
    from lightning.pytorch.loggers import Logger, WandbLogger


def wandb_key_configured() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (FileNotFoundError, netrc.NetrcParseError):
        return False


def resolve_wandb_mode(mode: str) -> str:
    """online | offline | disabled: `auto` is online only when a key is configured."""
    if mode == "auto":
        return "online" if wandb_key_configured() else "offline"
    return mode


def make_wandb_logger(config: ExperimentConfig, **init_args) -> WandbLogger | None:
    """Lightning's WandbLogger for a training run (None when disabled); `init_args` (from
    `log.loggers`) override the defaults. The trainer's ConfigLogger callback logs the config."""
    from lightning.pytorch.loggers import WandbLogger

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
    logger = WandbLogger(**{**defaults, **init_args})
    if "anonymous" not in init_args:
        # Lightning always passes `anonymous` (None when unset) to wandb.init, and wandb 0.31
        # warns that the setting has no effect whatever its value; unset, it says nothing.
        logger._wandb_init.pop("anonymous", None)
    return logger


def start_run(config: ExperimentConfig, job: str, out_dir: str | Path) -> Any:
    """A W&B run of its own for an evaluation (None when disabled), written under the
    evaluation's `out_dir` (`<out_dir>/wandb/`) so the points of a sweep do not share one
    directory. End it with `finish_run`."""
    mode = resolve_wandb_mode(config.log.wandb_mode)
    if mode == "disabled":
        return None
    import wandb

    return wandb.init(
        project=config.log.project,
        name=config.log.run_name or None,
        job_type=job,
        mode=mode,  # type: ignore[arg-type]  # resolve_wandb_mode returns one of wandb's modes
        dir=str(out_dir),
        config=as_dict(config),
    )


def finish_run(*runs: Any) -> None:
    """Finish `runs`, then wait for W&B's service to exit: finish() can return before the
    service has written the offline `.wandb` log, and a later run in this process (a test, a
    notebook) must start from clean settings. Nothing without a run."""
    if not runs:
        return
    import wandb

    for run in runs:
        run.finish()
    wandb.teardown()


def finish_loggers(loggers: list[Logger]) -> None:
    """`finish_run` for every WandbLogger of a finished training run."""
    from lightning.pytorch.loggers import WandbLogger

    finish_run(*(logger.experiment for logger in loggers if isinstance(logger, WandbLogger)))
