"""YaRN (Peng et al., 2023, §3.2-3.4): per-dimension interpolation and an attention factor."""

import math
from dataclasses import dataclass

from longctx.config.checks import at_least
from longctx.config.methods.registry import (
    MethodSpec,
    keep_partial_rotary,
    pretended,
    protocol_resolver,
    register_method,
)
from longctx.errors import ConfigError, HFAttentionError


@dataclass
class YarnConfig:
    """YaRN (Peng et al., 2023, §3.2-3.4), the model's rope.py implementation."""

    factor: float = 0.0
    """Extension factor s; 0 = the baseline protocol's 1.5."""
    original_max_position: int = 0
    """Context the frequencies are ramped against; 0 = the protocol's round(2/3 L)."""
    beta_fast: float = 32.0
    """Dimensions rotating more than this often over the original context extrapolate (paper: 32)."""
    beta_slow: float = 1.0
    """Dimensions rotating less than this often are interpolated (paper: 1)."""


def protocol(training_length: int) -> dict:
    pretend, factor = pretended(training_length)
    return {"factor": factor, "original_max_position": pretend, "beta_fast": 32.0, "beta_slow": 1.0}


def _check(values: dict, prefix: str) -> None:
    at_least(f"{prefix}.factor", values["factor"], 1)
    if values["beta_fast"] <= values["beta_slow"]:
        raise ConfigError(f"{prefix}.beta_fast", f"{values['beta_fast']} must exceed beta_slow={values['beta_slow']}")


def hf_rope(parameters: dict, resolved: dict, head_dim: int) -> dict:
    """YaRN as transformers rope parameters (its `yarn` type: the same ramp and 0.1 ln(s) + 1)."""
    if not math.isfinite(resolved["factor"]):
        raise HFAttentionError(f"longctx_yarn: factor={resolved['factor']} is not finite")
    edited = {
        "rope_type": "yarn",
        "rope_theta": parameters["rope_theta"],
        "factor": float(resolved["factor"]),
        "original_max_position_embeddings": int(resolved["original_max_position"]),
        "beta_fast": float(resolved["beta_fast"]),
        "beta_slow": float(resolved["beta_slow"]),
    }
    return keep_partial_rotary(parameters, edited)


SPEC = register_method(
    MethodSpec(
        "yarn",
        YarnConfig,
        "rope",
        "YaRN frequency interpolation with its attention factor (Peng et al., 2023)",
        protocol_resolver(protocol, ("factor", "original_max_position"), _check),
        protocol,
        order=2,
        hf_rope=hf_rope,
    )
)
