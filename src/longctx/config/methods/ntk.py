"""NTK-aware RoPE scaling (LocalLLaMA, 2023): base' = base * a^(d/(d-2))."""

from dataclasses import dataclass

from longctx.config.methods.registry import MethodSpec, pretended, protocol_resolver, register_method
from longctx.errors import ConfigError


@dataclass
class NtkConfig:
    """NTK-aware RoPE (LocalLLaMA, 2023): base' = base * factor^(d/(d-2))."""

    factor: float = 0.0
    """Extension factor a; 0 = the baseline protocol's L / (2/3 L) = 1.5."""


def protocol(training_length: int) -> dict:
    return {"factor": pretended(training_length)[1]}


def _check(values: dict, prefix: str) -> None:
    if values["factor"] < 1:
        raise ConfigError(f"{prefix}.factor", f"must be >= 1, got {values['factor']}")


SPEC = register_method(
    MethodSpec(
        "ntk",
        NtkConfig,
        "rope",
        "NTK-aware scaling of RoPE's base (LocalLLaMA, 2023)",
        protocol_resolver(protocol, ("factor",), _check),
        protocol,
        order=1,
    )
)
