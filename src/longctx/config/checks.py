"""Field checks the config sections share; each raises `ConfigError` naming the key."""

from __future__ import annotations

from typing import Any

from longctx.errors import ConfigError


def positive_int(key: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConfigError(key, f"must be a positive integer, got {value!r}")


def choice(key: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(key, f"{value!r} is not one of {choices}")


def at_least(key: str, value: Any, minimum: int, note: str = "") -> None:
    """`value` >= `minimum`; `note` says what the bound means (" (0 = off)")."""
    if value < minimum:
        raise ConfigError(key, f"must be >= {minimum}{note}, got {value}")


def above(key: str, value: Any, bound: int) -> None:
    if value <= bound:
        raise ConfigError(key, f"must be > {bound}, got {value}")


def boolean(key: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ConfigError(key, f"must be true or false, got {value!r}")


def component_spec(spec: Any, key: str) -> tuple[str, dict]:
    """(class path or name, init args) of one `log.loggers` / `train.callbacks` entry."""
    if isinstance(spec, str) and spec:
        return spec, {}
    if isinstance(spec, dict):
        unknown = set(spec) - {"class_path", "init_args"}
        if unknown:
            raise ConfigError(f"{key}.{sorted(unknown)[0]}", "unknown key (an entry has class_path and init_args)")
        class_path, init_args = spec.get("class_path"), spec.get("init_args") or {}
        if not isinstance(class_path, str) or not class_path:
            raise ConfigError(f"{key}.class_path", "missing: a name or a dotted class path")
        if not isinstance(init_args, dict):
            raise ConfigError(f"{key}.init_args", f"must be a mapping, got {init_args!r}")
        return class_path, init_args
    raise ConfigError(key, f"must be a name, a class path or {{class_path, init_args}}, got {spec!r}")
