"""DPE (Lu et al., 2025, "Effective Length Extrapolation via Dimension-Wise Positional
Embeddings Manipulation", §3): Self-Extend per group of RoPE dimensions.

The authors' released code (github.com/LuLuLuyi/DPE, `dpe_for_llama.py`,
`dpe_flash_forward`) splits each head's rotated frequency pairs into groups (eight, evenly:
`dimension_groups_range` [0, 8, ..., 64] for head_dim 128), keeps RoPE for key distances
below a local window W, and beyond it rotates group g's pairs at floor(m / s_g) + W - W / s_g
for the query and floor(n / s_g) for the key. The scales s_g are found by probing
(`effective_length_detection/run_niah_detect.sh`): each group in turn takes the factors
1, 2, 4, ... while the others stay at 2 x (test length / training length), and the best
NIAH score picks it. Their optional top-k dimension selection (scaling only the pairs with
the largest q/k attention contribution per layer and head) is not built here.
"""

from dataclasses import dataclass

from longctx.config.checks import above
from longctx.config.methods.registry import MethodSpec, register_method
from longctx.errors import ConfigError

DEFAULT_GROUPS = 8
"""The authors' eight even groups of rotated pairs."""
DEFAULT_SCALE = 2
"""The scale the authors' probing holds the other groups at when probing at the training length."""


@dataclass
class DpeConfig:
    """DPE (Lu et al., 2025): per-group Self-Extend of RoPE's frequency pairs."""

    local_window: int = 0
    """W: key distances below it keep RoPE in every dimension; 0 = L / 8 (the authors' 1024 for 8K-trained Llama 3)."""
    scale_factors: str = ""
    """s_g per group of rotated pairs, fastest group first, '-'-joined as the authors' --group_sizes
    ('2-8-2-8-32-32-32-4'); the groups split the pairs evenly; '' = 2 in each of 8 groups."""


def parse_scales(text: object, key: str) -> tuple[int, ...]:
    """'2-8-4' (or a sequence of ints) -> (2, 8, 4); '' -> the default; ConfigError naming `key`."""
    if isinstance(text, str):
        parts = [part.strip() for part in text.split("-")] if text.strip() else []
    else:
        parts = list(text)  # type: ignore[call-overload]
    if not parts:
        return (DEFAULT_SCALE,) * DEFAULT_GROUPS
    try:
        scales = tuple(int(part) for part in parts)
    except (TypeError, ValueError):
        raise ConfigError(key, f"expected positive integers joined by '-', got {text!r}") from None
    if any(scale < 1 for scale in scales):
        raise ConfigError(key, f"every scale must be >= 1, got {scales}")
    return scales


def resolve(section: DpeConfig, training_length: int, prefix: str) -> dict:
    """W (0 = L / 8) and the scales, spelled canonically ('2-2-2-2-2-2-2-2': a resolved
    config reads back as itself, in transformers' config.json too); each scale must divide
    W, where the released code's prefill offset W - W / s (a float) and its decoding offset
    W - W // s agree."""
    window = section.local_window or max(1, training_length // 8)
    above(f"{prefix}.local_window", window, 0)
    scales = parse_scales(section.scale_factors, f"{prefix}.scale_factors")
    for scale in scales:
        if window % scale:
            raise ConfigError(
                f"{prefix}.scale_factors",
                f"scale {scale} does not divide local_window={window} (the released code's offset W - W/s)",
            )
    return {"local_window": window, "scale_factors": "-".join(str(scale) for scale in scales)}


SPEC = register_method(
    MethodSpec(
        "dpe",
        DpeConfig,
        "passes",
        "DPE: Self-Extend per group of RoPE dimensions, scales by NIAH probing (Lu et al., 2025)",
        resolve,
        order=7,
    )
)


def probing_grid(test_length: int, training_length: int, groups: int = DEFAULT_GROUPS, shortest: int = 1024) -> dict:
    """The authors' probing (`effective_length_detection/run_niah_detect.sh`): {(group g,
    factor f): scale_factors} where group g (1-based) takes f and every other group the hold
    value 2 x test_length // training_length; f runs over test_length // n for n =
    test_length, test_length / 2, ... down to `shortest` (1, 2, 4, 8 at 8K). Their NIAH
    score per entry, best per group, gives s_g."""
    hold = 2 * test_length // training_length
    factors, length = [], test_length
    while length >= shortest:
        factors.append(test_length // length)
        length //= 2
    grid = {}
    for group in range(1, groups + 1):
        for factor in factors:
            scales = [hold] * groups
            scales[group - 1] = factor
            grid[group, factor] = "-".join(str(scale) for scale in scales)
    return grid
