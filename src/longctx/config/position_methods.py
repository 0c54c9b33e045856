"""Configuration of the evaluation-time position methods and STRING §4.2's baseline protocol.

`PositionMethodConfig` is the `eval.position_method` config section (and each entry of
`eval.arms`): the method's `name` and, under each registered method's own name, its
parameters (`eval.position_method.string.local_window`,
`eval.position_method.grouped_rope.group`), one spelling for in-tree and plugin methods.
The sections are not written here: they are the registry's (longctx.config.methods.registry),
each the parameter dataclass of the method's spec, with its defaults, docstrings and
checks. `resolved()` fills the fields left at 0 by the method's spec (the baselines'
protocol, StRing's shift_ratio) and names the config key of an impossible value.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from longctx.config.methods.ntk import NtkConfig
from longctx.config.methods.registry import arm_spec, in_tree_names, method_names, method_spec
from longctx.config.methods.rope import RopeConfig
from longctx.config.methods.string import REPO_STRING_ATTENTION_FACTOR, StringConfig
from longctx.errors import ConfigError

POSITION_METHODS = in_tree_names()
"""The in-tree methods, STRING Table 1's order; `method_names()` adds the plugins."""
PREFIX = "eval.position_method"

__all__ = [
    "POSITION_METHODS",
    "REPO_STRING_ATTENTION_FACTOR",
    "NtkConfig",
    "PositionMethodConfig",
    "RopeConfig",
    "StringConfig",
    "arm_config",
    "baseline_protocol",
]


@dataclass(eq=False)
class PositionMethodConfig:
    """Which position method evaluation uses, and the parameters of every registered method.

    `PositionMethodConfig(...)` is an instance of a subclass with one field per registered
    method, named after it and typed by its spec's parameter dataclass (`_with_sections`).
    A field per method, rather than a mapping of them, is what lets OmegaConf check each
    key and type of a YAML file against the method's dataclass (naming the dotted key and
    where it was set), resolve `${eval.position_method.string.local_window}`, and write
    configs and checkpoints in the spelling they are read in; made from the registry, a
    plugin's section is made as an in-tree method's is, with no edit here. A method
    registered after a config was made reads as its defaults there (`params_of`).
    """

    name: str = "rope"
    """rope | ntk | yarn | rerope | self_extend | dca | string, or any registered method
    (`longctx methods` lists them); its parameters: `eval.position_method.<name>.<field>`."""

    def __new__(cls, *args: Any, **kwargs: Any) -> PositionMethodConfig:
        made: PositionMethodConfig = object.__new__(_with_sections() if cls is PositionMethodConfig else cls)
        return made

    def __post_init__(self) -> None:
        for method in method_names():
            values = getattr(self, method, None)
            if isinstance(values, dict):  # from Python: `PositionMethodConfig(grouped_rope={"group": 4})`
                setattr(self, method, method_spec(method).params(**_known(method, values, f"{PREFIX}.{method}")))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PositionMethodConfig):
            return NotImplemented
        return (self.name, self.sections()) == (other.name, other.sections())

    def __reduce__(self) -> tuple:
        """Pickled as its name and sections: the subclass is made at run time, so pickle
        could not find it by its name."""
        return _restored, (self.name, self.sections())

    def params_of(self, method: str) -> Any:
        """The parameter dataclass of `method` as configured (its defaults where this config
        was made before the method registered)."""
        values = getattr(self, method, None)
        return values if values is not None else method_spec(method, f"{PREFIX}.name").params()

    def sections(self) -> dict[str, Any]:
        """{method: its parameters as configured} for every registered method."""
        return {method: self.params_of(method) for method in method_names()}

    def with_params(self, name: str, values: dict[str, Any]) -> PositionMethodConfig:
        """This config switched to method `name` with `values` set on its parameters; a
        parameter the method does not have is a ConfigError naming its key."""
        sections = self.sections()
        method_spec(name, f"{PREFIX}.name")
        sections[name] = dataclasses.replace(sections[name], **_known(name, values, f"{PREFIX}.{name}"))
        return PositionMethodConfig(name=name, **sections)

    def section(self, prefix: str = PREFIX) -> tuple[Any, str]:
        """(the parameters dataclass of `name` as configured, its config key)."""
        method_spec(self.name, f"{prefix}.name")
        return self.params_of(self.name), f"{prefix}.{self.name}"

    def resolved(self, training_length: int, prefix: str = PREFIX) -> dict:
        """Parameters of the selected method with 0-valued fields filled in (by the
        baseline protocol, or StRing's shift_ratio); raises ConfigError naming the key
        (`prefix`.name, `prefix`.string.shift, ...) of an impossible value."""
        spec = method_spec(self.name, f"{prefix}.name")
        section, key = self.section(prefix)
        if spec.resolve is None:
            return dict(vars(section))
        return spec.resolve(section, training_length, key)

    def settings(self, training_length: int, prefix: str = PREFIX) -> dict:
        """What a result records of its method: the name, the parameters as set (StRing's
        shift_ratio, say) and what they resolved to for a model of this training length."""
        section, _ = self.section(prefix)
        return {"name": self.name, **vars(section), "resolved": self.resolved(training_length, prefix)}


_SUBCLASSES: dict[tuple[str, ...], type] = {}


def _with_sections() -> type:
    """PositionMethodConfig with a field per registered method (made once per set of methods)."""
    names = method_names()
    if names not in _SUBCLASSES:
        taken = [name for name in names if hasattr(PositionMethodConfig, name) or name == "params"]
        if taken:
            raise ValueError(
                f"position methods {taken}: the names are taken by eval.position_method's own keys "
                "(its attributes, and `params`, which the loader reads as <method> sections)"
            )
        fields = [(n, method_spec(n).params, dataclasses.field(default_factory=method_spec(n).params)) for n in names]
        namespace = {"__module__": __name__, "__doc__": PositionMethodConfig.__doc__}
        made = dataclasses.make_dataclass(
            "PositionMethodConfig", fields, bases=(PositionMethodConfig,), eq=False, namespace=namespace
        )
        _SUBCLASSES[names] = made
    return _SUBCLASSES[names]


def _restored(name: str, sections: dict[str, Any]) -> PositionMethodConfig:
    return PositionMethodConfig(name=name, **sections)


def _known(method: str, values: dict[str, Any], key: str) -> dict[str, Any]:
    """`values`, if each is a parameter of `method`; else a ConfigError naming `key.<field>`."""
    known = [field.name for field in dataclasses.fields(method_spec(method, key).params)]
    for unknown in sorted(set(values) - set(known)):
        raise ConfigError(f"{key}.{unknown}", f"unknown key: {method} has parameters {known}")
    return values


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
