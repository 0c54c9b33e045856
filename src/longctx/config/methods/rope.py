"""Plain RoPE (Su et al., 2021): every relative position as trained."""

from dataclasses import dataclass

from longctx.config.methods.registry import MethodSpec, pretended, register_method


@dataclass
class RopeConfig:
    """Plain RoPE (name=rope)."""

    repo_score_scale: bool = False
    """Scale attention scores by (1 + 0.1 ln 2)^2, the temperature of StRing's released code
    (compat='repo'), without its shift: the ablation arm that tells whether the shift or the
    temperature helps (docs/design.md §14)."""


def _resolve(section: RopeConfig, training_length: int, prefix: str) -> dict:
    return {"repo_score_scale": True} if section.repo_score_scale else {}


def protocol(training_length: int) -> dict:
    pretended(training_length)  # the protocol's length check
    return {}


SPEC = register_method(
    MethodSpec("rope", RopeConfig, "passes", "plain RoPE, one pass over every distance", _resolve, protocol, order=0)
)
