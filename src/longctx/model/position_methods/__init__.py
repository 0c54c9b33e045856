"""Evaluation-time position methods: StRing and the training-free baselines (STRING §4).

    method = build_position_method(cfg.eval.position_method, cfg.model)
    logits = model(input_ids, position_method=method)      # the model calls method.prepare

Modules, top to bottom: `method` (PositionMethod, the builders: the model's positions
provider), `plan` (passes and per-forward plans), `cpu` (pure-torch kernels) and `gpu`
(band passes on the varlen FlashAttention kernel). Their config, the `eval.position_method`
section and STRING §4.2's protocol, is `longctx.config.position_methods`. Imports go one
way: this package reads `model.llama`, never the reverse.
"""

from longctx.model.position_methods.method import (
    MethodPositions,
    PositionMethod,
    build_position_method,
    dca_method,
    ntk_method,
    rerope_method,
    rope_method,
    self_extend_method,
    string_method,
    yarn_method,
)
from longctx.model.position_methods.plan import UNBOUNDED, AttentionPass, PositionPlan, band_pass

__all__ = [
    "UNBOUNDED",
    "AttentionPass",
    "MethodPositions",
    "PositionMethod",
    "PositionPlan",
    "band_pass",
    "build_position_method",
    "dca_method",
    "ntk_method",
    "rerope_method",
    "rope_method",
    "self_extend_method",
    "string_method",
    "yarn_method",
]
