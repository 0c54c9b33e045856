"""Evaluation-time position methods: StRing and the training-free baselines (STRING §4).

    method = build_position_method(cfg.eval.position_method, cfg.model)
    logits = model(input_ids, position_method=method)      # the model calls method.prepare

Modules, top to bottom: `registry` (each method's builder by name, beside its torch-free
spec in longctx.config.methods), `methods/` (the in-tree builders, one module each),
`method` (PositionMethod: the model's positions provider), `plan` (passes and per-forward plans), `cpu` (pure-torch kernels) and `gpu`
(band passes on the varlen FlashAttention kernel). Their config, the `eval.position_method`
section and STRING §4.2's protocol, is `longctx.config.position_methods`. Imports go one
way: this package reads `model.llama`, never the reverse.
"""

from longctx.model.position_methods.method import MethodPositions, PositionMethod, build_position_method
from longctx.model.position_methods.methods.dca import dca_method
from longctx.model.position_methods.methods.ntk import ntk_method
from longctx.model.position_methods.methods.rerope import rerope_method
from longctx.model.position_methods.methods.rope import rope_method
from longctx.model.position_methods.methods.self_extend import self_extend_method
from longctx.model.position_methods.methods.string import string_method
from longctx.model.position_methods.methods.yarn import yarn_method
from longctx.model.position_methods.plan import UNBOUNDED, AttentionPass, PositionPlan, band_pass
from longctx.model.position_methods.registry import builder_for, position_method, register_builder

__all__ = [
    "UNBOUNDED",
    "AttentionPass",
    "MethodPositions",
    "PositionMethod",
    "PositionPlan",
    "band_pass",
    "build_position_method",
    "builder_for",
    "dca_method",
    "ntk_method",
    "position_method",
    "register_builder",
    "rerope_method",
    "rope_method",
    "self_extend_method",
    "string_method",
    "yarn_method",
]
