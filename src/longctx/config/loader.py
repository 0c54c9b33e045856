"""Loading a configuration: YAML files + `key=value` overrides, merged and validated.

    cfg = longctx.config.load(["experiments/pretrain/tiny_1k.yaml"], ["train.max_steps=50"])
    cfg.model.n_layers, cfg.data.window, cfg.train.lr

Sources merge left to right (later wins): the model preset named by `model.preset`, then
each YAML file, then each override. The override `inherit=FILE.yaml` layers a whole file at
its place among the overrides (how a W&B sweep grids over recipe files). A YAML file may start
with `inherit: [other.yaml]` (paths relative to that file) to layer itself on other files.
Files named without a directory that does not exist are looked up under `experiments/`.

Everything is checked before an experiment starts: an unknown key ("did you mean"), a value
of the wrong type and an impossible combination raise `ConfigError` naming the dotted key
and where it was set (`file.yaml:LINE` or `override 'key=value'`).
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from longctx.config.experiment import ExperimentConfig
from longctx.config.model import ModelConfig
from longctx.config.position_methods import PositionMethodConfig
from longctx.errors import ConfigError

EXPERIMENTS_DIR = Path("experiments")


@dataclass
class _Source:
    """One layer of configuration and where each of its keys came from."""

    name: str
    values: dict
    locations: dict[str, str]
    list_item: tuple[str, Any] | None = None
    """An override that indexes a list (`data.mixture.0.weight=2`): (dotted key, value),
    applied with OmegaConf.update, since merging {'0': ...} into a list is a type error."""


def load(paths: Sequence[str | Path] = (), overrides: Sequence[str] = ()) -> ExperimentConfig:
    """Merge the preset, YAML files and `key=value` overrides; validate; return the config."""
    sources = _sources(paths, overrides)
    locations = _locations(sources)

    preset = "debug"
    for source in sources:
        model_values = source.values.get("model")
        if isinstance(model_values, dict):
            preset = model_values.get("preset", preset)
    try:
        base = ExperimentConfig(model=ModelConfig.from_preset(preset))
    except ConfigError as error:
        raise _located(error, locations) from None
    base.data.target_length = 0  # resolved by __post_init__ against the final model.max_position

    merged = cast(DictConfig, OmegaConf.structured(base))
    for source in sources:
        try:
            _with_arms(merged, source.values)
            if source.list_item is None:
                # In place: OmegaConf.merge deep-copies the whole config once per source,
                # which was half of a load's time (74 experiment loads: 15.4 s -> 7.9 s).
                merged.merge_with(source.values)
            else:
                _update_list_item(merged, *source.list_item)
        except OmegaConfBaseException as error:
            raise _omegaconf_error(error, source, merged) from None
    try:
        return cast(ExperimentConfig, OmegaConf.to_object(merged))
    except ConfigError as error:
        raise _located(error, locations) from None
    except OmegaConfBaseException as error:  # e.g. a missing mandatory value
        raise ConfigError(getattr(error, "full_key", "?") or "?", str(error)) from None


def where_set(paths: Sequence[str | Path] = (), overrides: Sequence[str] = ()) -> dict[str, str]:
    """Each dotted key the YAML files and overrides set (inherited files and `inherit=`
    overrides included) -> where it was last set (`file.yaml:LINE` or `override 'k=v'`);
    the keys a user chose, as opposed to the dataclass defaults."""
    return _locations(_sources(paths, overrides, notice=False))


def _sources(paths: Sequence[str | Path], overrides: Sequence[str], notice: bool = True) -> list[_Source]:
    """The YAML files, then the overrides (`inherit=FILE.yaml`: a whole file at its place
    among them), in merge order; old spellings read as the current ones."""
    sources = [s for path in paths for s in _read_yaml(Path(path), chain=())]
    for text in overrides:
        key, _, value = text.partition("=")
        sources += _read_yaml(Path(value.strip()), chain=()) if key.strip() == "inherit" else [_read_override(text)]
    return [_params_spelling(source, notice) for source in sources]


def _locations(sources: list[_Source]) -> dict[str, str]:
    """Each dotted key -> where the last source setting it set it."""
    return {key: where for source in sources for key, where in source.locations.items()}


def locate(error: ConfigError, paths: Sequence[str | Path] = (), overrides: Sequence[str] = ()) -> ConfigError:
    """`error` with where its key (and related keys) were set among the YAML files and
    overrides `load` read: for checks that need more than the config (the world size a
    launch gives), made after loading."""
    return _located(error, where_set(paths, overrides))


def to_yaml(config: ExperimentConfig) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(config))


def as_dict(config: ExperimentConfig) -> dict:
    return dataclasses.asdict(config)


def from_dict(values: dict) -> ExperimentConfig:
    """The inverse of `as_dict` (a checkpoint's hyper-parameters), validated."""
    values = copy.deepcopy(values)
    _read_params_spelling(values)
    try:
        merged = cast(DictConfig, OmegaConf.structured(ExperimentConfig))
        _with_arms(merged, values)
        merged.merge_with(values)
        return cast(ExperimentConfig, OmegaConf.to_object(merged))
    except OmegaConfBaseException as error:
        raise ConfigError(getattr(error, "full_key", "?") or "?", str(error).splitlines()[0]) from None


def _resolve_path(path: Path) -> Path:
    if path.exists():
        return path
    candidate = EXPERIMENTS_DIR / path
    if candidate.exists():
        return candidate
    raise FileNotFoundError(f"config file {path} not found (also looked in {candidate})")


def _read_yaml(path: Path, chain: tuple[Path, ...]) -> list[_Source]:
    path = _resolve_path(path)
    if path.resolve() in chain:
        raise ConfigError("inherit", f"{path} inherits itself through {' -> '.join(map(str, chain))}")
    text = path.read_text()
    try:
        values = yaml.safe_load(text) or {}
    except yaml.YAMLError as error:
        raise ConfigError("<yaml>", f"{path}: not valid YAML: {error}") from None
    if not isinstance(values, dict):
        raise ConfigError("<yaml>", f"{path}: the top level must be a mapping, got {type(values).__name__}")
    lines = _key_lines(text)
    inherited = values.pop("inherit", [])
    if isinstance(inherited, str):
        inherited = [inherited]
    sources = []
    for parent in inherited:
        sources += _read_yaml(path.parent / parent, (*chain, path.resolve()))
    locations = {key: f"{path}:{line}" for key, line in lines.items()}
    sources.append(_Source(str(path), values, locations))
    return sources


def _method_sections(values: dict) -> list[tuple[str, dict]]:
    """(config key, section) of `eval.position_method` and of each `eval.arms.<arm>` in `values`."""
    evaluation = values.get("eval")
    if not isinstance(evaluation, dict):
        return []
    sections = [("eval.position_method", evaluation.get("position_method"))]
    arms = evaluation.get("arms")
    if isinstance(arms, dict):
        sections += [(f"eval.arms.{name}", arm) for name, arm in arms.items()]
    return [(prefix, section) for prefix, section in sections if isinstance(section, dict)]


def _read_params_spelling(values: dict) -> list[tuple[str, str]]:
    """Read `<section>.params.<method>.<field>` as `<section>.<method>.<field>` (in place),
    so that the configs, sweeps and checkpoints that keep a method's parameters under
    `params` load to the same settings; returns (that key, the key it is read as) per method.
    A field set both ways takes the `<method>.<field>` value."""
    moved = []
    for prefix, section in _method_sections(values):
        params = section.get("params")
        if not isinstance(params, dict) or not all(isinstance(fields, dict) for fields in params.values()):
            continue  # left for the unknown-key error
        del section["params"]
        for method, fields in params.items():
            section[method] = {**fields, **(section.get(method) or {})}
            moved.append((f"{prefix}.params.{method}", f"{prefix}.{method}"))
    return moved


def _params_spelling(source: _Source, notice: bool = True) -> _Source:
    """`_read_params_spelling` on a YAML file or override, with where each key was set kept
    for errors and (`notice`) a one-line notice naming the key to write instead."""
    for old, new in _read_params_spelling(source.values):
        for key in [key for key in source.locations if key == old or key.startswith(old + ".")]:
            source.locations[new + key[len(old) :]] = source.locations[key]
        where = source.locations.get(old, source.name)
        if notice:
            warnings.warn(f"{old}.<field> (at {where}) is read as {new}.<field>: write the latter", FutureWarning, 2)
    return source


def _with_arms(merged: DictConfig, values: dict) -> None:
    """Give each arm `values` names a section of its own before merging it: `eval.arms` is
    typed as PositionMethodConfig, whose method fields only an instance has (position_methods.py)."""
    for prefix, _ in _method_sections(values):
        name = prefix.removeprefix("eval.arms.")
        if prefix.startswith("eval.arms.") and name not in merged.eval.arms:
            merged.eval.arms[name] = PositionMethodConfig()


def _read_override(text: str) -> _Source:
    if "=" not in text:
        raise ConfigError(text, f"override {text!r} is not of the form key=value")
    key = text.split("=", 1)[0].strip()
    try:
        values = cast(dict, OmegaConf.to_container(OmegaConf.from_dotlist([text])))
    except OmegaConfBaseException as error:
        raise ConfigError(key, f"override {text!r} could not be parsed: {error}") from None
    list_item = None
    if any(part.isdigit() for part in key.split(".")):
        leaf: Any = values
        for part in key.split("."):
            leaf = leaf[part]
        list_item = (key, leaf)
    return _Source(f"override '{text}'", values, {key: f"override '{text}'"}, list_item)


def _update_list_item(merged: DictConfig, key: str, value: Any) -> None:
    parts = key.split(".")
    for depth, part in enumerate(parts):
        if not part.isdigit():
            continue
        parent = ".".join(parts[:depth])
        node = OmegaConf.select(merged, parent)
        if not isinstance(node, ListConfig):
            raise ConfigError(key, f"{parent} is not a list, so {part!r} cannot index it")
        if int(part) >= len(node):
            raise ConfigError(key, f"{parent} has {len(node)} entries (indices 0-{len(node) - 1}); no entry {part}")
    OmegaConf.update(merged, key, value, merge=True)


def _key_lines(text: str) -> dict[str, int]:
    """Dotted key -> 1-based line number for every mapping key of a YAML document."""
    lines: dict[str, int] = {}

    def walk(node, prefix: str) -> None:
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                key = f"{prefix}{key_node.value}"
                lines[key] = key_node.start_mark.line + 1
                walk(value_node, key + ".")

    walk(yaml.compose(text), "")
    return lines


def _located(error: ConfigError, locations: dict[str, str]) -> ConfigError:
    """Append where the key (and the other keys of a combination) were set."""
    places = []
    if error.key in locations:
        places.append(f"set at {locations[error.key]}")
    places += [f"{key} set at {locations[key]}" for key in error.related if key in locations]
    if not places:
        return error
    return ConfigError(error.key, f"{error.message} ({'; '.join(places)})", error.related)


def _omegaconf_error(error: OmegaConfBaseException, source: _Source, merged: DictConfig) -> ConfigError:
    key = getattr(error, "full_key", None) or "?"
    where = source.locations.get(key, source.name)
    message = getattr(error, "msg", str(error)).splitlines()[0]
    if "not in struct" in message or ("Key '" in message and "not" in message):
        parent, _, leaf = key.rpartition(".")
        node = OmegaConf.select(merged, parent) if parent else merged
        known = [str(name) for name in node] if isinstance(node, DictConfig) else []
        close = difflib.get_close_matches(leaf, known, n=1)
        hint = f"; did you mean {parent + '.' if parent else ''}{close[0]}?" if close else ""
        return ConfigError(key, f"unknown key (at {where}){hint}")
    return ConfigError(key, f"{message} (at {where})")
