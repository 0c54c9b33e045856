"""Dual Chunk Attention (An et al., 2024, §3.1): keys at their place in a chunk."""

from dataclasses import dataclass

from longctx.config.methods.registry import MethodSpec, pretended, protocol_resolver, register_method
from longctx.errors import ConfigError


@dataclass
class DcaConfig:
    """Dual Chunk Attention (An et al., 2024, §3.1); relative positions stay below chunk_size + local_window."""

    chunk_size: int = 0
    """s: keys sit at n mod s; 0 = the released ChunkLlama code's 3/4 L' - L'/8 = 5/8 L'."""
    local_window: int = 0
    """w: successive-chunk queries keep exact distances for their first w offsets; 0 = L'/8 (released code)."""


def protocol(training_length: int) -> dict:
    pretend, _ = pretended(training_length)
    return {"chunk_size": pretend * 3 // 4 - pretend // 8, "local_window": pretend // 8}


def _check(values: dict, prefix: str) -> None:
    if values["local_window"] > values["chunk_size"]:
        raise ConfigError(
            f"{prefix}.local_window",
            f"{values['local_window']} exceeds chunk_size={values['chunk_size']}",
            (f"{prefix}.chunk_size",),
        )


SPEC = register_method(
    MethodSpec(
        "dca",
        DcaConfig,
        "passes",
        "Dual Chunk Attention: intra, successive and inter-chunk passes (An et al., 2024)",
        protocol_resolver(protocol, ("chunk_size", "local_window"), _check),
        protocol,
        order=5,
    )
)
