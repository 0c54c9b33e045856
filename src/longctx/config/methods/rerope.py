"""ReRoPE (Su, 2023; bojone/rerope): relative positions capped at a window, P' = min(P, w)."""

from dataclasses import dataclass

from longctx.config.methods.registry import MethodSpec, pretended, protocol_resolver, register_method
from longctx.errors import ConfigError


@dataclass
class ReRopeConfig:
    """ReRoPE (Su, 2023; bojone/rerope): P' = min(P, window)."""

    window: int = 0
    """Relative positions >= window are set to window; 0 = the protocol's L'/8 (the patch's 512 at 4096)."""
    log_scale_length: int = 0
    """Queries at m scale by max(1, log(m+1)/log(this)); 0 = the protocol's L', -1 = off."""


def protocol(training_length: int) -> dict:
    pretend, _ = pretended(training_length)
    return {"window": pretend // 8, "log_scale_length": pretend}


def _check(values: dict, prefix: str) -> None:
    if values["log_scale_length"] != -1 and values["log_scale_length"] < 2:
        raise ConfigError(f"{prefix}.log_scale_length", f"must be >= 2 or -1 (off), got {values['log_scale_length']}")


SPEC = register_method(
    MethodSpec(
        "rerope",
        ReRopeConfig,
        "passes",
        "ReRoPE: distances beyond a window held at the window (Su, 2023)",
        protocol_resolver(protocol, ("window",), _check),
        protocol,
        order=3,
    )
)
