"""Self-Extend (Jin et al., 2024, §3): exact neighbours, grouped positions beyond."""

import math
from dataclasses import dataclass

from longctx.config.methods.registry import MethodSpec, pretended, protocol_resolver, register_method


@dataclass
class SelfExtendConfig:
    """Self-Extend (Jin et al., 2024). Extends to (L' - w_n) * G + w_n tokens."""

    neighbor_window: int = 0
    """w_n: relative positions below it are exact; 0 = the protocol's L'/4 (1024 at 4096), made a multiple of G."""
    group_size: int = 0
    """G: farther positions are floor-divided by G; 0 = the smallest G whose extended window covers L."""


def protocol(training_length: int) -> dict:
    pretend, _ = pretended(training_length)
    window = pretend // 4
    group = math.ceil((training_length - window) / (pretend - window))
    return {"neighbor_window": window - window % group, "group_size": group}


SPEC = register_method(
    MethodSpec(
        "self_extend",
        SelfExtendConfig,
        "passes",
        "Self-Extend: exact neighbour window, floor-divided groups beyond (Jin et al., 2024)",
        protocol_resolver(protocol, ("neighbor_window", "group_size")),
        protocol,
        order=4,
    )
)
