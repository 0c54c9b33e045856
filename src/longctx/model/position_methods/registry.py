"""The position-method registry's torch half: one builder per registered method name.

A builder turns a rotary embedding (the model's RoPE: head dim, base, scaling, training
length, position scale) and the method's resolved parameters into a `PositionMethod`:

    @register_builder("my_method")
    def build(rotary: RotaryEmbedding, *, alpha: float) -> PositionMethod: ...

Its spec (name, parameter dataclass, kind) is longctx.config.methods.registry's; the
in-tree builders are the modules of longctx/model/position_methods/methods/, found by
their package, and tests/model/test_registry.py checks that every spec has a
builder and every builder a spec. `position_method` registers both halves at once for a
method defined in the user's own module.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from longctx.config.methods.registry import MethodSpec, load_plugins, method_spec, register_method

Builder = Callable[..., Any]
"""(rotary embedding, **resolved parameters) -> a PositionMethod (method.py, which imports
this module: the type is not named here to keep imports one way)."""
_BUILDERS: dict[str, Builder] = {}
_LOADED = [False]


def register_builder(name: str) -> Callable[[Builder], Builder]:
    """Decorator: `builder(rotary, **resolved_params)` builds method `name`."""

    def register(builder: Builder) -> Builder:
        if name in _BUILDERS and _BUILDERS[name] is not builder:
            raise ValueError(f"position method {name!r} has a builder already")
        _BUILDERS[name] = builder
        return builder

    return register


def position_method(
    name: str, params: type, *, kind: str = "passes", summary: str = "", **spec: Any
) -> Callable[[Builder], Builder]:
    """Decorator for a method of one's own: registers its spec (`params`: a dataclass of its
    parameters with defaults; `spec` the other MethodSpec fields, e.g. `resolve`) and the
    decorated builder under `name`. It then runs by name wherever a method is named: YAML
    (`eval.position_method.name`, its parameters as `eval.position_method.<name>.<field>`),
    the CLI, the evaluation engine, the lm-eval backend and `longctx_<name>` in transformers."""

    def register(builder: Builder) -> Builder:
        origin = getattr(builder, "__module__", "") or "user"
        register_method(MethodSpec(name, params, kind, summary or name, plugin=origin, **spec))
        return register_builder(name)(builder)

    return register


def _load_in_tree() -> None:
    if _LOADED[0]:
        return
    _LOADED[0] = True
    for module in pkgutil.iter_modules([str(Path(__file__).parent / "methods")]):
        importlib.import_module(f"{__package__}.methods.{module.name}")


def builder_for(name: str) -> Builder:
    """The builder of a registered method; a spec without a builder is an error naming it."""
    _load_in_tree()
    load_plugins()
    spec = method_spec(name)
    if spec.name not in _BUILDERS:
        raise ValueError(f"position method {name!r} is registered ({spec.plugin or 'in-tree'}) but has no builder")
    return _BUILDERS[spec.name]


def builder_names() -> tuple[str, ...]:
    _load_in_tree()
    load_plugins()
    return tuple(_BUILDERS)
