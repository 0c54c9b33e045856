"""The position-method registry's torch-free half: one `MethodSpec` per method name.

A spec says what a method is called, which parameters it takes (a dataclass whose fields
carry their docstrings), how 0-valued fields are filled (STRING §4.2's protocol for the
baselines, StRing's S = L/3) and what values are impossible, and its kind:

- `passes`: the method rewrites relative positions inside attention (a list of passes
  merged by their log-sum-exps): StRing, ReRoPE, Self-Extend, DCA, plain RoPE. These
  run in longctx's model and, as `longctx_<name>`, inside any supported transformers model.
- `rope`: the method only edits RoPE's frequencies (NTK, YaRN): longctx's model rotates
  with its RotaryEmbedding; a transformers model gets new rope parameters.

The builder of each method (the torch half: rotary embedding and parameters -> a
`PositionMethod`) lives under the same name in longctx.model.position_methods. Every list
of method names in the suite (config validation, CLI defaults, the lm-eval backend, the
transformers functions, the GPU checks, the benchmarks) is read from here, so adding an
in-tree method is its spec module in longctx/config/methods/ and its builder module in
longctx/model/position_methods/methods/, both found by their package.

An *arm* is a method with preset parameters under a name of its own (`string-repo` =
`string` with compat='repo'): tables and checks name arms and methods alike.

Plugins: a module of the user's registers with `register_method` (and the builder with
`longctx.model.position_methods.register_builder`, or both at once with
`longctx.model.position_methods.position_method`); the CLI imports it when named in
`LONGCTX_PLUGINS` (comma-separated module names or .py paths), and an installed package
is found through the entry-point group `longctx.position_methods`, each entry point a
module or callable that registers when loaded. Both load on the first lookup, so `longctx
config` can validate a YAML naming a plugin method without torch as long as the plugin's
module imports torch only in its builder.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import importlib.metadata
import importlib.util
import inspect
import itertools
import os
import pkgutil
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from longctx.config.checks import above
from longctx.errors import ConfigError

ENTRY_POINT_GROUP = "longctx.position_methods"
KINDS = ("passes", "rope")
Resolver = Callable[[Any, int, str], dict]
"""(the parameters dataclass as configured, training length L, config key prefix) ->
the resolved parameters, raising ConfigError naming `prefix.<field>` for an impossible value."""
HfRope = Callable[[dict, dict, int], dict]
"""(a transformers model's rope parameters, the method's resolved parameters, the rotated
channels d of a head) -> the transformers rope parameters that rotate as the method does."""


@dataclass(frozen=True)
class MethodSpec:
    name: str
    """What YAML (`eval.position_method.name`), the CLI and `longctx_<name>` call it."""
    params: type
    """A dataclass of the parameters, each field with a default and a docstring."""
    kind: str
    """passes | rope (module docstring)."""
    summary: str
    """One line for `longctx methods`: the method and its paper."""
    resolve: Resolver | None = None
    """Fills and checks the parameters; None = every field as configured."""
    protocol: Callable[[int], dict] | None = None
    """STRING §4.2's baseline protocol for a training length: the values that fields left
    at 0 take (`baseline_protocol`); None for methods outside the protocol."""
    plugin: str = ""
    """Where a method registered from outside longctx came from ('' = in-tree)."""
    order: int = 100
    """Place in listings and default tables (in-tree: STRING Table 1's column order)."""
    hf_rope: HfRope | None = None
    """A `rope`-kind method's transformers equivalent: how longctx.hf_attention runs it in a
    Hugging Face model (by editing its rope parameters); None = it runs there only as an
    attention function (`passes`), or not at all."""


@dataclass(frozen=True)
class ArmSpec:
    name: str
    method: str
    params: dict[str, Any] = field(default_factory=dict)
    """The method's parameters this arm presets."""
    summary: str = ""


_METHODS: dict[str, MethodSpec] = {}
_ARMS: dict[str, ArmSpec] = {}
_LISTENERS: list[Callable[[MethodSpec], None]] = []
_LOADED = {"in_tree": False, "plugins": False}


def register_method(spec: MethodSpec) -> MethodSpec:
    """Add a method; a second spec under a taken name is an error (a plugin cannot shadow
    an in-tree method silently). Listeners (e.g. longctx.hf_attention registering
    `longctx_<name>` with transformers) hear of it."""
    if spec.kind not in KINDS:
        raise ValueError(f"position method {spec.name!r}: kind {spec.kind!r} is not one of {KINDS}")
    if not dataclasses.is_dataclass(spec.params):
        raise TypeError(f"position method {spec.name!r}: params must be a dataclass, got {spec.params!r}")
    taken = _METHODS.get(spec.name) or _ARMS.get(spec.name)
    if taken is not None and taken != spec:
        raise ValueError(f"position method {spec.name!r} is registered already")
    _METHODS[spec.name] = spec
    for listener in _LISTENERS:
        listener(spec)
    return spec


def register_arm(name: str, method: str, summary: str = "", **params: Any) -> ArmSpec:
    """A named preset of `method` (its spec must be registered first: no plugin loading
    here, this runs while the in-tree specs import)."""
    if method not in _METHODS:
        raise ValueError(f"arm {name!r}: its method {method!r} is not registered")
    known = {f.name for f in dataclasses.fields(_METHODS[method].params)}
    unknown = sorted(set(params) - known)
    if unknown:
        raise ValueError(f"arm {name!r}: {method} has no parameters {unknown} (it has {sorted(known)})")
    arm = ArmSpec(name, method, dict(params), summary)
    if name in _METHODS or (name in _ARMS and _ARMS[name] != arm):
        raise ValueError(f"arm {name!r}: the name is registered already")
    _ARMS[name] = arm
    return arm


def on_register(listener: Callable[[MethodSpec], None]) -> None:
    """Call `listener` for every method registered so far and every later one."""
    _LISTENERS.append(listener)
    for spec in list(_METHODS.values()):
        listener(spec)


def _load_in_tree() -> None:
    if _LOADED["in_tree"]:
        return
    _LOADED["in_tree"] = True
    for module in pkgutil.iter_modules([str(Path(__file__).parent)]):
        if module.name != "registry":
            importlib.import_module(f"{__package__}.{module.name}")


PLUGINS_VARIABLE = "LONGCTX_PLUGINS"


def _import_plugin(item: str) -> None:
    """A module name, or a .py file loaded as a module named after its stem."""
    if not item.endswith(".py"):
        importlib.import_module(item)
        return
    path = Path(item).expanduser().resolve()
    if not path.is_file():
        raise ConfigError(PLUGINS_VARIABLE, f"{item}: no such file")
    loaded = sys.modules.get(path.stem)
    if loaded is not None and Path(getattr(loaded, "__file__", "") or "").resolve() == path:
        return  # imported already (e.g. by the user's own script): it has registered
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)


def load_plugins() -> None:
    """Load, once, the modules named in LONGCTX_PLUGINS and every `longctx.position_methods`
    entry point (a module registers on import; a callable is called)."""
    _load_in_tree()
    if _LOADED["plugins"]:
        return
    _LOADED["plugins"] = True
    for item in filter(None, (part.strip() for part in os.environ.get(PLUGINS_VARIABLE, "").split(","))):
        _import_plugin(item)
    for entry_point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        loaded = entry_point.load()
        if callable(loaded) and not isinstance(loaded, type):
            loaded()


def method_spec(name: str, key: str = "eval.position_method.name") -> MethodSpec:
    """The spec of `name`; ConfigError naming `key` and the registered names if unknown."""
    load_plugins()
    if name not in _METHODS:
        raise ConfigError(key, f"{name!r} is not a registered position method; registered: {method_names()}")
    return _METHODS[name]


def method_names(kind: str = "") -> tuple[str, ...]:
    """Registered method names (in-tree first, in registration order), of one kind if given."""
    load_plugins()
    ordered = sorted(_METHODS.values(), key=lambda spec: spec.order)  # stable: registration order within
    return tuple(spec.name for spec in ordered if not kind or spec.kind == kind)


def arm_names() -> tuple[str, ...]:
    load_plugins()
    return tuple(_ARMS)


def arm_spec(name: str, key: str = "eval.position_method.name") -> ArmSpec:
    """An arm, or a method as the arm of its defaults; ConfigError naming `key` if neither."""
    load_plugins()
    if name in _ARMS:
        return _ARMS[name]
    if name not in _METHODS:
        raise ConfigError(
            key, f"{name!r} is neither a registered position method {method_names()} nor an arm {arm_names()}"
        )
    return ArmSpec(name, name)


def field_docs(params: type) -> dict[str, str]:
    """{field: its docstring (the string literal under it)} of a parameters dataclass, read
    from its source; '' where there is none or the source cannot be read."""
    docs = {f.name: "" for f in dataclasses.fields(params)}
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(params)))
    except (OSError, TypeError, SyntaxError):
        return docs
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    for node, following in itertools.pairwise(body):
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        if isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant):
            docs[node.target.id] = " ".join(str(following.value.value).split())
    return docs


def in_tree_names() -> tuple[str, ...]:
    _load_in_tree()
    return tuple(spec.name for spec in sorted(_METHODS.values(), key=lambda spec: spec.order) if not spec.plugin)


# --- STRING §4.2's baseline protocol, shared by the baselines' specs ----------------------

BASELINE_TRAINING_FRACTION = 2 / 3
"""STRING §4.2: baselines pretend the model was trained at 2/3 of its training length."""


def pretended(training_length: int) -> tuple[int, float]:
    """(L' = round(2/3 L), the extrapolation factor L / L' ~ 1.5) of the protocol."""
    if training_length < 16:
        raise ValueError(f"training_length={training_length} is too short for the baseline protocol (needs >= 16)")
    pretend = round(BASELINE_TRAINING_FRACTION * training_length)
    return pretend, training_length / pretend


def keep_partial_rotary(parameters: dict, edited: dict) -> dict:
    """`edited` rope parameters with the model's partial_rotary_factor, where it has one (Phi-3/4)."""
    if parameters.get("partial_rotary_factor") not in (None, 1, 1.0):
        edited["partial_rotary_factor"] = parameters["partial_rotary_factor"]
    return edited


def protocol_resolver(
    protocol: Callable[[int], dict], positive: tuple[str, ...], check: Callable[[dict, str], None] | None = None
) -> Resolver:
    """Fields left at 0 take the protocol's value; `positive` fields must then be > 0;
    `check(values, prefix)` raises ConfigError for what else is impossible."""

    def resolve(section: Any, training_length: int, prefix: str) -> dict:
        defaults = protocol(training_length)
        values = {key: value or defaults[key] for key, value in vars(section).items()}
        for key in positive:
            above(f"{prefix}.{key}", values[key], 0)
        if check is not None:
            check(values, prefix)
        return values

    return resolve
