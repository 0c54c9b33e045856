"""Lightning loggers and callbacks from the config, and one way for probes to write through them.

    log:
      loggers: [wandb, csv, tensorboard, mlflow]            # names ...
    log:
      loggers:
        - wandb
        - class_path: lightning.pytorch.loggers.CSVLogger   # ... or class paths with init args
          init_args: {flush_logs_every_n_steps: 10}
    train:
      callbacks:
        - class_path: lightning.pytorch.callbacks.LearningRateMonitor
          init_args: {logging_interval: step}

Names and their defaults: `wandb` (the default; `log.wandb_mode`, `log.project` and
`log.run_name` apply, wandb_setup.py), `csv` (`<out_dir>/csv/metrics.csv`),
`tensorboard` (`<out_dir>/tensorboard/`, needs tensorboard or tensorboardX) and `mlflow`
(a file store at `<out_dir>/mlruns`, experiment `log.project`, needs mlflow or
mlflow-skinny; pass `init_args: {tracking_uri: ...}` for a server or database). `init_args`
override the defaults; `class_path` may also be one of the names.

Probes (f(i), NIAH) write scalars through every logger's `log_metrics` and richer objects
as each logger can hold them:

    logger          table                      line plot, image              file
    W&B             wandb.Table                wandb.plot.line, wandb.Image  artifact
    MLflow          log_table (JSON artifact)  log_figure, PNG artifact      artifact
    TensorBoard     markdown text              add_figure, add_image         -
    CSV and others  CSV file under log_dir     PNG file under log_dir        -

(the probes write their full numbers into the run directory in every case).

Step axis: Lightning logs the `self.log` metrics of optimizer step k (global_step k once it
is done) at step k - 1 (its `_batches_that_stepped` before the increment, the counter
LearningRateMonitor logs at too). `logger_step` gives the probes that step, so f(i) and
NIAH measured after step k sit on the same W&B / TensorBoard / MLflow step as step k's
train/loss, and fi/tokens_seen equals train/tokens_seen there.
"""

from __future__ import annotations

import csv
import importlib
import os
import shutil
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.loggers import Logger, MLFlowLogger, TensorBoardLogger, WandbLogger

from longctx.config import ExperimentConfig, as_dict
from longctx.config.checks import component_spec
from longctx.errors import ConfigError

LOGGER_CLASSES = {
    "wandb": "lightning.pytorch.loggers.WandbLogger",
    "csv": "lightning.pytorch.loggers.CSVLogger",
    "tensorboard": "lightning.pytorch.loggers.TensorBoardLogger",
    "mlflow": "lightning.pytorch.loggers.MLFlowLogger",
}


def instantiate(class_path: str, init_args: dict, key: str, base: type) -> Any:
    """`class_path(**init_args)`, checked to be a `base`; errors name the config key."""
    module_name, _, class_name = class_path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module_name), class_name) if module_name else None
    except (ImportError, AttributeError) as error:
        raise ConfigError(key, f"cannot import {class_path}: {error}") from None
    if not isinstance(cls, type) or not issubclass(cls, base):
        raise ConfigError(key, f"{class_path} is not a {base.__module__}.{base.__qualname__}")
    try:
        return cls(**init_args)
    except (TypeError, ValueError, ModuleNotFoundError) as error:
        raise ConfigError(key, f"{class_path}({', '.join(init_args)}): {error}") from None


def _defaults(name: str, config: ExperimentConfig) -> dict:
    out_dir = Path(config.train.out_dir)
    if name == "csv":
        return {"save_dir": str(out_dir), "name": "csv", "version": ""}
    if name == "tensorboard":
        return {"save_dir": str(out_dir), "name": "tensorboard", "version": "", "default_hp_metric": False}
    if name == "mlflow":
        # MLflow 3 keeps its file store (no database server or SQLAlchemy needed) behind a flag
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        return {
            "experiment_name": config.log.project,
            "run_name": config.log.run_name or None,
            "save_dir": str(out_dir.resolve() / "mlruns"),
        }
    return {}


def build_loggers(config: ExperimentConfig) -> list[Logger]:
    """The loggers `log.loggers` names (W&B left out when `log.wandb_mode=disabled`)."""
    from longctx.wandb_setup import make_wandb_logger

    loggers: list[Logger] = []
    for i, spec in enumerate(config.log.loggers):
        key = f"log.loggers.{i}"
        class_path, init_args = component_spec(spec, key)
        if class_path == "wandb":
            logger = make_wandb_logger(config, **init_args)
            if logger is not None:
                loggers.append(logger)
            continue
        init_args = {**_defaults(class_path, config), **init_args}
        loggers.append(instantiate(LOGGER_CLASSES.get(class_path, class_path), init_args, key, Logger))
    return loggers


def build_callbacks(config: ExperimentConfig) -> list[L.Callback]:
    """The extra callbacks `train.callbacks` names."""
    return [
        instantiate(*component_spec(spec, f"train.callbacks.{i}"), f"train.callbacks.{i}", L.Callback)
        for i, spec in enumerate(config.train.callbacks)
    ]


class ConfigLogger(L.Callback):
    """Logs the experiment config once to every logger, as the flat sections of the YAML
    (`model`, `data`, `train`, ...): the module saves its hyper-parameters with
    `logger=False`, so Lightning does not log them a second time."""

    def __init__(self, config: ExperimentConfig):
        self.config = config

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.log_hyperparams(as_dict(self.config))


# --- probes -------------------------------------------------------------------------------


def logger_step(trainer: L.Trainer) -> int:
    """The logger step of the optimizer step just completed (see the module docstring)."""
    return max(trainer.global_step - 1, 0)


def _files_dir(logger: Logger) -> Path | None:
    directory = getattr(logger, "log_dir", None) or getattr(logger, "save_dir", None)
    return Path(directory) if directory else None


def log_scalars(trainer: L.Trainer, metrics: dict[str, float], step: int) -> None:
    for logger in trainer.loggers:
        logger.log_metrics(metrics, step=step)


def log_table(
    trainer: L.Trainer,
    key: str,
    columns: list[str],
    rows: list[list],
    step: int,
    line: tuple[str, str, str] | None = None,
) -> None:
    """A table (rows of `columns`); `line=(x, y, title)` also draws y over x where a
    logger can show a plot."""
    for logger in trainer.loggers:
        if isinstance(logger, WandbLogger):
            import wandb

            table = wandb.Table(columns=list(columns), data=rows)  # its stub wants list[str | int]
            value = wandb.plot.line(table, line[0], line[1], title=line[2]) if line else table
            logger.experiment.log({key: value, "trainer/global_step": step})
        elif isinstance(logger, MLFlowLogger):
            name = f"{key}/step-{step:07d}"
            logger.experiment.log_table(
                logger.run_id, {c: [r[i] for r in rows] for i, c in enumerate(columns)}, artifact_file=f"{name}.json"
            )
            if line:
                logger.experiment.log_figure(logger.run_id, _figure(columns, rows, line), f"{name}.png")
        elif isinstance(logger, TensorBoardLogger):
            if line:
                logger.experiment.add_figure(key, _figure(columns, rows, line), global_step=step)
            else:
                header = f"| {' | '.join(columns)} |\n|{'---|' * len(columns)}\n"
                text = header + "".join(f"| {' | '.join(str(v) for v in row)} |\n" for row in rows)
                logger.experiment.add_text(key, text, global_step=step)
        elif (directory := _files_dir(logger)) is not None:
            path = directory / key / f"step-{step:07d}.csv"
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("w", newline="") as handle:
                writer = csv.writer(handle)
                writer.writerow(columns)
                writer.writerows(rows)


def log_image(trainer: L.Trainer, key: str, path: Path, step: int) -> None:
    """A PNG file as an image."""
    for logger in trainer.loggers:
        if isinstance(logger, WandbLogger):
            import wandb

            logger.experiment.log({key: wandb.Image(str(path)), "trainer/global_step": step})
        elif isinstance(logger, MLFlowLogger):
            logger.experiment.log_artifact(logger.run_id, str(path), artifact_path=f"{key}/step-{step:07d}")
        elif isinstance(logger, TensorBoardLogger):
            import matplotlib.image

            logger.experiment.add_image(key, matplotlib.image.imread(str(path)), global_step=step, dataformats="HWC")
        elif (directory := _files_dir(logger)) is not None:
            target = directory / key / f"step-{step:07d}{path.suffix}"
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)


def log_file(trainer: L.Trainer, path: Path, name: str, kind: str) -> None:
    """A file as a versioned artifact `name` (W&B) or under `name/` (MLflow); other loggers
    keep none (the file is in the run directory)."""
    for logger in trainer.loggers:
        if isinstance(logger, WandbLogger):
            import wandb

            artifact = wandb.Artifact(f"{name}-{logger.experiment.id}", type=kind)
            artifact.add_file(str(path))
            logger.experiment.log_artifact(artifact)
        elif isinstance(logger, MLFlowLogger):
            logger.experiment.log_artifact(logger.run_id, str(path), artifact_path=name)


def _figure(columns: list[str], rows: list[list], line: tuple[str, str, str]):
    from matplotlib.figure import Figure

    x, y = columns.index(line[0]), columns.index(line[1])
    figure = Figure(figsize=(6, 3.5))
    axes = figure.subplots()
    axes.plot([row[x] for row in rows], [row[y] for row in rows])
    axes.set(xlabel=line[0], ylabel=line[1], title=line[2])
    figure.tight_layout()
    return figure
