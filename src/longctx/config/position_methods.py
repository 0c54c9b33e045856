"""Configuration of the evaluation-time position methods and STRING §4.2's baseline protocol.

`PositionMethodConfig` is the `eval.position_method` config section; `resolved()` fills
the fields left at 0 by the method's spec (the baselines' protocol, StRing's shift_ratio)
and names the config key of an impossible value. What methods exist, with which
parameters, is the registry's (longctx.config.methods.registry): the seven in-tree methods
have a section each here (`eval.position_method.string.local_window`); any other registered
method, a plugin or a newer in-tree one, keeps its parameters under
`eval.position_method.params.<name>` (the loader moves `eval.position_method.<name>.*`
there), checked against its spec's parameter dataclass as the config is built (an unknown
key is a ConfigError naming it, as everywhere).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from longctx.config.methods.dca import DcaConfig
from longctx.config.methods.ntk import NtkConfig
from longctx.config.methods.registry import (
    BASELINE_TRAINING_FRACTION,
    arm_spec,
    in_tree_names,
    method_names,
    method_spec,
)
from longctx.config.methods.rerope import ReRopeConfig
from longctx.config.methods.rope import RopeConfig
from longctx.config.methods.self_extend import SelfExtendConfig
from longctx.config.methods.string import REPO_STRING_ATTENTION_FACTOR, STRING_COMPAT, StringConfig
from longctx.config.methods.yarn import YarnConfig
from longctx.errors import ConfigError

POSITION_METHODS = tuple(
    name for name in in_tree_names() if name in {"rope", "ntk", "yarn", "rerope", "self_extend", "dca", "string"}
)
"""The in-tree methods with a section of their own below, STRING Table 1's order; newer
in-tree methods (dpe) and plugins keep theirs under `params`; `method_names()` lists all."""

__all__ = [
    "BASELINE_TRAINING_FRACTION",
    "POSITION_METHODS",
    "REPO_STRING_ATTENTION_FACTOR",
    "STRING_COMPAT",
    "DcaConfig",
    "NtkConfig",
    "PositionMethodConfig",
    "ReRopeConfig",
    "RopeConfig",
    "SelfExtendConfig",
    "StringConfig",
    "YarnConfig",
    "arm_config",
    "baseline_protocol",
]


@dataclass
class PositionMethodConfig:
    """Which position method evaluation uses, and the parameters of each."""

    name: str = "rope"
    """rope | ntk | yarn | rerope | self_extend | dca | string, or any registered method
    (`longctx methods` lists them)."""
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
    params: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Parameters of registered methods without a section above (plugins, newer in-tree
    methods), by method name: `eval.position_method.params.my_method.alpha=2`."""

    def __post_init__(self) -> None:
        for name in self.params:
            self._checked_params(name, "eval.position_method")

    def _checked_params(self, name: str, prefix: str) -> Any:
        """`params[name]` as its method's parameter dataclass; a method that is not
        registered, or a field it does not have, is a ConfigError naming the key."""
        key = f"{prefix}.params.{name}"
        spec = method_spec(name, key)
        if name in POSITION_METHODS:
            raise ConfigError(key, f"{name} has a section of its own: set {prefix}.{name}.<field>")
        values = dict(self.params.get(name) or {})
        known = [f.name for f in dataclasses.fields(spec.params)]
        for unknown in sorted(set(values) - set(known)):
            raise ConfigError(f"{key}.{unknown}", f"unknown key: {name} has parameters {known}")
        return spec.params(**values)

    def with_params(self, name: str, values: dict[str, Any]) -> PositionMethodConfig:
        """This config switched to method `name` with `values` set on its parameters: its
        own section for an in-tree method, `params[name]` for any other."""
        config = dataclasses.replace(self, name=name)
        if not values:
            return config
        if name in POSITION_METHODS:
            return dataclasses.replace(config, **{name: dataclasses.replace(getattr(config, name), **values)})
        return dataclasses.replace(config, params={**config.params, name: {**config.params.get(name, {}), **values}})

    def section(self, prefix: str = "eval.position_method") -> tuple[Any, str]:
        """(the parameters dataclass of `name` as configured, its config key)."""
        method_spec(self.name, f"{prefix}.name")
        if self.name in POSITION_METHODS:
            return getattr(self, self.name), f"{prefix}.{self.name}"
        return self._checked_params(self.name, prefix), f"{prefix}.params.{self.name}"

    def resolved(self, training_length: int, prefix: str = "eval.position_method") -> dict:
        """Parameters of the selected method with 0-valued fields filled in (by the
        baseline protocol, or StRing's shift_ratio); raises ConfigError naming the key
        (`prefix`.name, `prefix`.string.shift, ...) of an impossible value."""
        spec = method_spec(self.name, f"{prefix}.name")
        section, key = self.section(prefix)
        if spec.resolve is None:
            return dict(vars(section))
        return spec.resolve(section, training_length, key)

    def settings(self, training_length: int, prefix: str = "eval.position_method") -> dict:
        """What a result records of its method: the name, the parameters as set (StRing's
        shift_ratio, say) and what they resolved to for a model of this training length."""
        section, _ = self.section(prefix)
        return {"name": self.name, **vars(section), "resolved": self.resolved(training_length, prefix)}


def baseline_protocol(method_name: str, training_length: int) -> dict:
    """Parameters of a baseline under STRING §4.2's protocol: the model is treated as
    trained at L' = round(2/3 L) and extrapolated by L / L' (= 1.5) to its real length L.
    Each method's other parameters keep its own paper's/released code's proportions."""
    spec = method_spec(method_name, "method_name") if method_name in method_names() else None
    if spec is None or spec.protocol is None:
        covered = tuple(name for name in method_names() if method_spec(name).protocol is not None)
        raise ValueError(f"method_name={method_name!r}: the baseline protocol covers {covered}")
    return spec.protocol(training_length)


def arm_config(
    name: str, base: PositionMethodConfig | None = None, key: str = "eval.position_method.name"
) -> PositionMethodConfig:
    """The config of a method or a registered arm (`string-repo`): `base`'s parameters (the
    defaults when None) under the arm's method, with the arm's presets set; an unknown
    name is a ConfigError naming `key`."""
    arm = arm_spec(name, key)
    return (base or PositionMethodConfig()).with_params(arm.method, arm.params)
