"""StRing (An et al., 2024, "Why Does the Effective Context Length of LLMs Fall Short?",
§4.1 Eq. 4): distances at or beyond S shifted down to start again at W."""

import math
from dataclasses import dataclass

from longctx.config.checks import at_least, choice
from longctx.config.methods.registry import MethodSpec, register_arm, register_method
from longctx.errors import ConfigError

STRING_COMPAT = ("paper", "repo")
REPO_STRING_ATTENTION_FACTOR = 1 + 0.1 * math.log(2)
"""cos/sin multiplier of the authors' released StRing code (compat='repo')."""


@dataclass
class StringConfig:
    """StRing (STRING §4.1). Paper: S = L/3, W = 128 for every model (Figure 7 ablation:
    W >= 32 and L/3 <= S <= L/2 work)."""

    shift: int = 0
    """Shift offset S in tokens; 0 = round(shift_ratio * L)."""
    shift_ratio: float = 1 / 3
    """S as a fraction of the training length L when `shift` is 0."""
    local_window: int = 128
    """Local window W: shifted pairs restart at relative position W. Must be < S."""
    compat: str = "paper"
    """paper: Eq. 4 exactly. repo: the authors' released code (diagonal m-n=S twice, scores x (1+0.1 ln 2)^2)."""


def resolve(config: StringConfig, training_length: int, prefix: str) -> dict:
    choice(f"{prefix}.compat", config.compat, STRING_COMPAT)
    at_least(f"{prefix}.shift", config.shift, 0, " (0 = shift_ratio * L)")
    shift = config.shift or round(config.shift_ratio * training_length)
    if shift <= 0:
        raise ConfigError(
            f"{prefix}.shift_ratio",
            f"gives shift S = round({config.shift_ratio} * {training_length}) = {shift}; S must be > 0",
        )
    if not 0 <= config.local_window < shift:
        raise ConfigError(
            f"{prefix}.local_window",
            f"must be in [0, shift S={shift}), got {config.local_window} (STRING Eq. 4 needs W < S)",
            (f"{prefix}.shift", f"{prefix}.shift_ratio"),
        )
    return {"shift": shift, "local_window": config.local_window, "compat": config.compat}


SPEC = register_method(
    MethodSpec(
        "string", StringConfig, "passes", "StRing: shifted well-trained positions (STRING §4.1)", resolve, order=6
    )
)
register_arm("string-repo", "string", "StRing as the authors' released code runs it", compat="repo")
