"""NTK-aware RoPE scaling (LocalLLaMA, 2023): base' = base * a^(d/(d-2))."""

from dataclasses import dataclass

from longctx.config.checks import at_least
from longctx.config.methods.registry import (
    MethodSpec,
    keep_partial_rotary,
    pretended,
    protocol_resolver,
    register_method,
)


@dataclass
class NtkConfig:
    """NTK-aware RoPE (LocalLLaMA, 2023): base' = base * factor^(d/(d-2))."""

    factor: float = 0.0
    """Extension factor a; 0 = the baseline protocol's L / (2/3 L) = 1.5."""


def protocol(training_length: int) -> dict:
    return {"factor": pretended(training_length)[1]}


def _check(values: dict, prefix: str) -> None:
    at_least(f"{prefix}.factor", values["factor"], 1)


def hf_rope(parameters: dict, resolved: dict, head_dim: int) -> dict:
    """NTK-aware scaling as transformers rope parameters: the default type with base *
    a^(d/(d-2)) (as model/rope.py's `ntk` and model/families/common.py's export)."""
    base = parameters["rope_theta"] * resolved["factor"] ** (head_dim / (head_dim - 2))
    return keep_partial_rotary(parameters, {"rope_type": "default", "rope_theta": base})


SPEC = register_method(
    MethodSpec(
        "ntk",
        NtkConfig,
        "rope",
        "NTK-aware scaling of RoPE's base (LocalLLaMA, 2023)",
        protocol_resolver(protocol, ("factor",), _check),
        protocol,
        order=1,
        hf_rope=hf_rope,
    )
)
