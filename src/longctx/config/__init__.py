"""Experiment configuration, at the bottom of the house: it imports nothing of longctx but
`errors`, and no torch, so `longctx config` validates a run without building anything.

    cfg = longctx.config.load(["experiments/pretrain/tiny_1k.yaml"], ["train.max_steps=50"])
    cfg.model.n_layers, cfg.data.window, cfg.train.lr

One module per section, each a small dataclass its component reads: `model` (the
architecture, presets), `position_methods` (`eval.position_method`, STRING §4.2's
protocol), `data`, `train` (and `sft`), `eval` (`eval.niah`, `probe`), `experiment` (their
composition, `log`, the checks across sections) and `loader` (YAML + overrides -> a
validated `ExperimentConfig`, errors naming the key and file:line).
"""

from longctx.config.data import DataConfig, DataSource, LongRecipeConfig, PoseConfig, RetrievalConfig
from longctx.config.eval import EvalConfig, NiahConfig, ProbeConfig
from longctx.config.experiment import ExperimentConfig, LogConfig
from longctx.config.loader import as_dict, from_dict, load, locate, to_yaml, where_set
from longctx.config.model import ModelConfig
from longctx.config.position_methods import PositionMethodConfig
from longctx.config.train import SftConfig, TrainConfig

__all__ = [
    "DataConfig",
    "DataSource",
    "EvalConfig",
    "ExperimentConfig",
    "LogConfig",
    "LongRecipeConfig",
    "ModelConfig",
    "NiahConfig",
    "PoseConfig",
    "PositionMethodConfig",
    "ProbeConfig",
    "RetrievalConfig",
    "SftConfig",
    "TrainConfig",
    "as_dict",
    "from_dict",
    "load",
    "locate",
    "to_yaml",
    "where_set",
]
