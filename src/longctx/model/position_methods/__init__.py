"""Evaluation-time position methods: StRing and the training-free baselines (STRING §4).

    method = build_position_method(cfg.eval.position_method, cfg.model)
    logits = model(input_ids, position_method=method)      # the model calls method.prepare

Modules, top to bottom: `method` (PositionMethod, the builders: the model's positions
provider), `config` (the `eval.position_method` section, STRING §4.2's protocol), `plan`
(passes and per-forward plans), `cpu` (pure-torch kernels) and `gpu` (band passes on the
varlen FlashAttention kernel). Imports go one way: this package reads `model.llama`
(ModelConfig), never the reverse.
"""

from longctx.model.position_methods.config import (
    BASELINE_TRAINING_FRACTION,
    POSITION_METHODS,
    REPO_STRING_ATTENTION_FACTOR,
    STRING_COMPAT,
    DcaConfig,
    NtkConfig,
    PositionMethodConfig,
    ReRopeConfig,
    RopeConfig,
    SelfExtendConfig,
    StringConfig,
    YarnConfig,
    baseline_protocol,
)
from longctx.model.position_methods.method import (
    MethodPositions,
    PositionMethod,
    build_position_method,
    dca_method,
    ntk_method,
    rerope_method,
    rope_method,
    self_extend_method,
    string_attention,
    string_method,
    yarn_method,
)
from longctx.model.position_methods.plan import UNBOUNDED, AttentionPass, PositionPlan, band_pass

__all__ = [
    "BASELINE_TRAINING_FRACTION",
    "POSITION_METHODS",
    "REPO_STRING_ATTENTION_FACTOR",
    "STRING_COMPAT",
    "UNBOUNDED",
    "AttentionPass",
    "DcaConfig",
    "MethodPositions",
    "NtkConfig",
    "PositionMethod",
    "PositionMethodConfig",
    "PositionPlan",
    "ReRopeConfig",
    "RopeConfig",
    "SelfExtendConfig",
    "StringConfig",
    "YarnConfig",
    "band_pass",
    "baseline_protocol",
    "build_position_method",
    "dca_method",
    "ntk_method",
    "rerope_method",
    "rope_method",
    "self_extend_method",
    "string_attention",
    "string_method",
    "yarn_method",
]
