"""Configuration of the evaluation-time position methods and STRING §4.2's baseline protocol.

`PositionMethodConfig` is the `eval.position_method` config section; `resolved()` fills
the fields left at 0 from the protocol (baselines) or StRing's shift_ratio and names the
config key of an impossible value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from longctx.errors import ConfigError

POSITION_METHODS = ("rope", "ntk", "yarn", "rerope", "self_extend", "dca", "string")
BASELINE_TRAINING_FRACTION = 2 / 3
"""STRING §4.2: baselines pretend the model was trained at 2/3 of its training length."""
STRING_COMPAT = ("paper", "repo")
REPO_STRING_ATTENTION_FACTOR = 1 + 0.1 * math.log(2)
"""cos/sin multiplier of the authors' released StRing code (compat='repo')."""


@dataclass
class RopeConfig:
    """Plain RoPE (name=rope)."""

    repo_score_scale: bool = False
    """Scale attention scores by (1 + 0.1 ln 2)^2, the temperature of StRing's released code
    (compat='repo'), without its shift: the ablation arm that tells whether the shift or the
    temperature helps (docs/design.md §14)."""


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


@dataclass
class NtkConfig:
    """NTK-aware RoPE (LocalLLaMA, 2023): base' = base * factor^(d/(d-2))."""

    factor: float = 0.0
    """Extension factor a; 0 = the baseline protocol's L / (2/3 L) = 1.5."""


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


@dataclass
class ReRopeConfig:
    """ReRoPE (Su, 2023; bojone/rerope): P' = min(P, window)."""

    window: int = 0
    """Relative positions >= window are set to window; 0 = the protocol's L'/8 (the patch's 512 at 4096)."""
    log_scale_length: int = 0
    """Queries at m scale by max(1, log(m+1)/log(this)); 0 = the protocol's L', -1 = off."""


@dataclass
class SelfExtendConfig:
    """Self-Extend (Jin et al., 2024). Extends to (L' - w_n) * G + w_n tokens."""

    neighbor_window: int = 0
    """w_n: relative positions below it are exact; 0 = the protocol's L'/4 (1024 at 4096), made a multiple of G."""
    group_size: int = 0
    """G: farther positions are floor-divided by G; 0 = the smallest G whose extended window covers L."""


@dataclass
class DcaConfig:
    """Dual Chunk Attention (An et al., 2024, §3.1); relative positions stay below chunk_size + local_window."""

    chunk_size: int = 0
    """s: keys sit at n mod s; 0 = the released ChunkLlama code's 3/4 L' - L'/8 = 5/8 L'."""
    local_window: int = 0
    """w: successive-chunk queries keep exact distances for their first w offsets; 0 = L'/8 (released code)."""


@dataclass
class PositionMethodConfig:
    """Which position method evaluation uses, and the parameters of each."""

    name: str = "rope"
    """rope | ntk | yarn | rerope | self_extend | dca | string."""
    rope: RopeConfig = field(default_factory=RopeConfig)
    """Plain RoPE parameters (name=rope)."""
    string: StringConfig = field(default_factory=StringConfig)
    """StRing parameters (name=string)."""
    ntk: NtkConfig = field(default_factory=NtkConfig)
    """NTK-aware scaling parameters (name=ntk)."""
    yarn: YarnConfig = field(default_factory=YarnConfig)
    """YaRN parameters (name=yarn)."""
    rerope: ReRopeConfig = field(default_factory=ReRopeConfig)
    """ReRoPE parameters (name=rerope)."""
    self_extend: SelfExtendConfig = field(default_factory=SelfExtendConfig)
    """Self-Extend parameters (name=self_extend)."""
    dca: DcaConfig = field(default_factory=DcaConfig)
    """Dual Chunk Attention parameters (name=dca)."""

    def resolved(self, training_length: int, prefix: str = "eval.position_method") -> dict:
        """Parameters of the selected method with 0-valued fields filled in (by the
        baseline protocol, or StRing's shift_ratio); raises ConfigError naming the key
        (`prefix`.name, `prefix`.string.shift, ...) of an impossible value."""
        if self.name not in POSITION_METHODS:
            raise ConfigError(f"{prefix}.name", f"{self.name!r} is not one of {POSITION_METHODS}")
        if self.name == "rope":
            return {"repo_score_scale": True} if self.rope.repo_score_scale else {}
        if self.name == "string":
            return _resolve_string(self.string, training_length, f"{prefix}.string")
        section = getattr(self, self.name)
        protocol = baseline_protocol(self.name, training_length)
        values = {key: value or protocol[key] for key, value in vars(section).items()}
        _check_baseline(self.name, values, f"{prefix}.{self.name}")
        return values


def baseline_protocol(method_name: str, training_length: int) -> dict:
    """Parameters of a baseline under STRING §4.2's protocol: the model is treated as
    trained at L' = round(2/3 L) and extrapolated by L / L' (= 1.5) to its real length L.
    Each method's other parameters keep its own paper's/released code's proportions."""
    if method_name not in POSITION_METHODS or method_name == "string":
        raise ValueError(f"method_name={method_name!r}: the baseline protocol covers {POSITION_METHODS[:-1]}")
    if training_length < 16:
        raise ValueError(f"training_length={training_length} is too short for the baseline protocol (needs >= 16)")
    pretend = round(BASELINE_TRAINING_FRACTION * training_length)
    factor = training_length / pretend
    if method_name == "rope":
        return {}
    if method_name == "ntk":
        return {"factor": factor}
    if method_name == "yarn":
        return {"factor": factor, "original_max_position": pretend, "beta_fast": 32.0, "beta_slow": 1.0}
    if method_name == "rerope":
        return {"window": pretend // 8, "log_scale_length": pretend}
    if method_name == "self_extend":
        window = pretend // 4
        group = math.ceil((training_length - window) / (pretend - window))
        return {"neighbor_window": window - window % group, "group_size": group}
    return {"chunk_size": pretend * 3 // 4 - pretend // 8, "local_window": pretend // 8}


def _resolve_string(config: StringConfig, training_length: int, prefix: str) -> dict:
    if config.compat not in STRING_COMPAT:
        raise ConfigError(f"{prefix}.compat", f"{config.compat!r} is not one of {STRING_COMPAT}")
    if config.shift < 0:
        raise ConfigError(f"{prefix}.shift", f"must be >= 0 (0 = shift_ratio * L), got {config.shift}")
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


def _check_baseline(name: str, values: dict, prefix: str) -> None:
    positive = {
        "ntk": ("factor",),
        "yarn": ("factor", "original_max_position"),
        "rerope": ("window",),
        "self_extend": ("neighbor_window", "group_size"),
        "dca": ("chunk_size", "local_window"),
    }[name]
    for key in positive:
        if values[key] <= 0:
            raise ConfigError(f"{prefix}.{key}", f"must be > 0, got {values[key]}")
    if name in ("ntk", "yarn") and values["factor"] < 1:
        raise ConfigError(f"{prefix}.factor", f"must be >= 1, got {values['factor']}")
    if name == "yarn" and values["beta_fast"] <= values["beta_slow"]:
        raise ConfigError(f"{prefix}.beta_fast", f"{values['beta_fast']} must exceed beta_slow={values['beta_slow']}")
    if name == "rerope" and values["log_scale_length"] != -1 and values["log_scale_length"] < 2:
        raise ConfigError(f"{prefix}.log_scale_length", f"must be >= 2 or -1 (off), got {values['log_scale_length']}")
    if name == "dca" and values["local_window"] > values["chunk_size"]:
        raise ConfigError(
            f"{prefix}.local_window",
            f"{values['local_window']} exceeds chunk_size={values['chunk_size']}",
            (f"{prefix}.chunk_size",),
        )
