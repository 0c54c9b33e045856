"""The experiment: the composition of every section, the `log` section, and the checks
across sections. Imports no torch.

Validation has one shape throughout: a section checks its own fields in `validate()`,
called from `__post_init__`, so it is valid wherever it is built (a YAML file, a
checkpoint, code); entries of a list are checked by the section holding the list, which
knows their index; checks that need another section's values are the section's
`validate_for_*` methods, called here once the 0 = "the model's" defaults are resolved.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from longctx.config.checks import choice, component_spec, positive_int
from longctx.config.data import DataConfig
from longctx.config.eval import EvalConfig, ProbeConfig
from longctx.config.model import ModelConfig
from longctx.config.train import SftConfig, TrainConfig
from longctx.errors import ConfigError

LOGGER_NAMES = ("wandb", "csv", "tensorboard", "mlflow")
"""Loggers `log.loggers` knows by name (train/loggers.py gives their classes and defaults)."""


@dataclass
class LogConfig:
    """Console and Weights & Biases logging."""

    every_steps: int = 10
    """Log metrics every this many optimizer steps."""
    wandb_mode: str = "auto"
    """auto (online if an API key is configured, else offline) | online | offline | disabled."""
    project: str = "longctx"
    """W&B project."""
    run_name: str = ""
    """W&B run name; '' = W&B's default."""
    loggers: list[Any] = field(default_factory=lambda: ["wandb"])
    """Lightning loggers: names (wandb | csv | tensorboard | mlflow) or {class_path, init_args}
    entries; every probe writes through all of them (train/loggers.py)."""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        positive_int("log.every_steps", self.every_steps)
        choice("log.wandb_mode", self.wandb_mode, ("auto", "online", "offline", "disabled"))
        for i, entry in enumerate(self.loggers):
            class_path, _ = component_spec(entry, f"log.loggers.{i}")
            if "." not in class_path and class_path not in LOGGER_NAMES:
                raise ConfigError(
                    f"log.loggers.{i}", f"{class_path!r} is not one of {LOGGER_NAMES} or a dotted class path"
                )


@dataclass
class ExperimentConfig:
    """The whole configuration of a run: one section per component, and the checkpoint it starts from."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    log: LogConfig = field(default_factory=LogConfig)
    probe: ProbeConfig = field(default_factory=ProbeConfig)
    sft: SftConfig = field(default_factory=SftConfig)
    init: str = ""
    """Checkpoint whose weights (and model config) start the run: SFT or continued
    pretraining; a .ckpt, a longctx .safetensors or an HF model directory. '' = random
    initialisation from `model`."""

    def __post_init__(self) -> None:
        if self.data.window == 0:
            self.data.window = self.model.max_position
        if self.data.target_length == 0:
            self.data.target_length = self.model.max_position
        self.validate()

    def validate(self) -> None:
        """The checks across sections (each section checked its own fields when it was built)."""
        self.data.validate_for_model(self.model.max_position)
        self.train.validate_for_data(self.data.window)
        self.train.validate_for_context_parallel(self.data.window, self.model.attention_backend, self.data)
        if self.train.context_parallel > 1 and "linear" in self.model.layer_kinds():
            raise ConfigError(
                "train.context_parallel",
                "linear (Gated DeltaNet) layers carry their state along the whole row: no sequence shard",
                ("model.layer_types", "model.linear_attention.full_every"),
            )
        self.eval.validate_for_model(self.model.max_position)
