"""Reading a W&B sweep YAML (longctx/sweep/__init__.py describes the format): its keys,
its parameters and their distributions, its command and macros; every error names the
file and the key at fault.
"""

from __future__ import annotations

import json
import math
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from longctx.errors import LongctxError

USED_KEYS = ("method", "parameters", "command", "program", "name", "project", "entity", "run_cap")
"""Top-level keys the local runner acts on."""
METADATA_KEYS = ("apiVersion", "kind", "description", "metric", "metrics")
"""Keys that describe the sweep and change nothing about which points run or how."""
SERVER_KEYS = {
    "controller": "the W&B controller (local or cloud) is not used",
    "early_terminate": "no run is stopped early; every point runs to its end",
    "scheduler": "the W&B Launch scheduler is not used",
    "job": "points run as local commands, not W&B Launch jobs",
    "image_uri": "points run as local commands, not in a container",
}
"""Keys of W&B's sweep schema that only a W&B server or Launch acts on: ignored with a note."""
METHODS = ("grid", "random")
DEFAULT_COMMAND = ("${env}", "${interpreter}", "${program}", "${args}")
"""W&B's command when the YAML has none."""
DISTRIBUTION_KEYS = {
    "constant": ("value",),
    "categorical": ("values", "probabilities"),
    "uniform": ("min", "max"),
    "int_uniform": ("min", "max"),
    "log_uniform_values": ("min", "max"),
    "q_uniform": ("min", "max", "q"),
}
"""Supported distributions and the spec keys each reads (besides `distribution`)."""
ARGUMENT_MACROS = {
    "args": lambda key, value: [f"--{key}={format_value(value)}"],
    "args_no_hyphens": lambda key, value: [f"{key}={format_value(value)}"],
    "args_no_equals": lambda key, value: [f"--{key}", format_value(value)],
    "args_no_boolean_flags": lambda key, value: (
        ([f"--{key}"] if value else []) if isinstance(value, bool) else [f"--{key}={format_value(value)}"]
    ),
    "args_append_hydra": lambda key, value: [f"+{key}={format_value(value)}"],
    "args_override_hydra": lambda key, value: [f"++{key}={format_value(value)}"],
}
"""Per-argument macros: each (key, value) becomes these command words."""
MACROS = (*ARGUMENT_MACROS, "args_json", "env", "interpreter", "program")
WHOLE_MACRO = re.compile(r"\$\{([^}]*)\}")
ENVVAR = re.compile(r"\$\{envvar:([A-Z0-9_]*)\}")  # W&B's pattern: upper case names only
_FLOAT_SLACK = 1e-9  # in units of q: 0.3 / 0.1 is 2.9999999999999996, still the multiple k = 3


class SweepError(LongctxError, ValueError):
    """An invalid sweep file; the message names the file and the key at fault."""

    def __init__(self, path: str | Path, key: str, message: str):
        super().__init__(f"{path}: {key}: {message}")
        self.path = str(path)
        self.key = key
        self.message = message


@dataclass(frozen=True)
class Parameter:
    """One entry of `parameters`: a distribution and what it reads."""

    name: str
    distribution: str
    values: tuple[Any, ...] = ()
    """constant: the one value; categorical: the choices."""
    probabilities: tuple[float, ...] | None = None
    min: float = 0
    max: float = 0
    q: float = 1

    def grid(self) -> list[Any]:
        """Every value a grid search visits; ValueError for a continuous distribution."""
        if self.distribution in ("constant", "categorical"):
            return list(self.values)
        if self.distribution == "int_uniform":
            return list(range(int(self.min), int(self.max) + 1))
        if self.distribution == "q_uniform":
            return np.arange(self.min, self.max, self.q).tolist()  # W&B's grid: max excluded
        raise ValueError(f"distribution {self.distribution} has no finite set of values for a grid search")

    def draw(self, rng: random.Random) -> Any:
        """One random-search value."""
        if self.distribution == "constant":
            return self.values[0]
        if self.distribution == "categorical":
            if self.probabilities is None:
                return rng.choice(self.values)
            return rng.choices(self.values, weights=self.probabilities)[0]
        if self.distribution == "uniform":
            return rng.uniform(self.min, self.max)
        if self.distribution == "int_uniform":
            return rng.randint(int(self.min), int(self.max))
        if self.distribution == "log_uniform_values":
            return math.exp(rng.uniform(math.log(self.min), math.log(self.max)))
        low, high = self._q_range()  # q_uniform
        return self._q_value(min(max(round(rng.uniform(self.min, self.max) / self.q), low), high))

    def _q_range(self) -> tuple[int, int]:
        """The multiples k*q inside [min, max], as (first k, last k)."""
        return (math.ceil(self.min / self.q - _FLOAT_SLACK), math.floor(self.max / self.q + _FLOAT_SLACK))

    def _q_value(self, k: int) -> int | float:
        if all(isinstance(x, int) for x in (self.min, self.max, self.q)):
            return k * int(self.q)
        return round(k * self.q, 12)  # 3 * 0.1 is 0.30000000000000004


@dataclass(frozen=True)
class Sweep:
    """A parsed sweep YAML."""

    path: Path
    name: str
    """The YAML's `name`, else the file's stem: the W&B run group and the summary folder."""
    method: str
    parameters: tuple[Parameter, ...]
    command: tuple[str, ...]
    program: str | None
    project: str | None = None
    entity: str | None = None
    run_cap: int | None = None
    notes: tuple[str, ...] = ()
    """One line per key that was accepted but is not acted on here (SERVER_KEYS)."""

    def default_summary(self) -> Path:
        return Path("runs/sweeps") / re.sub(r"[^\w.-]+", "_", self.name) / "summary.jsonl"


@dataclass(frozen=True)
class Point:
    """One run of a sweep: its index, its arguments and the argv that runs it."""

    index: int
    arguments: dict[str, Any]
    command: list[str]


def load_sweep(path: str | Path) -> Sweep:
    """Read and check a W&B sweep YAML; SweepError names the key at fault."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist")
    try:
        document = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        raise SweepError(path, "(file)", f"not valid YAML: {error}") from None
    if not isinstance(document, dict):
        raise SweepError(path, "(file)", "must be a mapping with method, parameters and command")
    known = (*USED_KEYS, *METADATA_KEYS, *SERVER_KEYS)
    for key in document:
        if key not in known:
            raise SweepError(path, str(key), f"not a key of W&B's sweep schema (known: {', '.join(known)})")
    notes = tuple(f"{key}: {why} (only a W&B server acts on it)" for key, why in SERVER_KEYS.items() if key in document)

    method = document.get("method")
    if method in ("bayes", "custom"):
        raise SweepError(
            path,
            "method",
            f"{method} search needs the W&B server's model: run it with "
            f"`wandb sweep {path}` and `wandb agent ENTITY/PROJECT/SWEEP_ID`",
        )
    if method not in METHODS:
        raise SweepError(path, "method", f"must be grid or random (or bayes/custom, through W&B), got {method!r}")

    specs = document.get("parameters")
    if not isinstance(specs, dict) or not specs:
        raise SweepError(path, "parameters", "missing: a mapping of config key -> value/values/distribution")
    # W&B's engine orders parameters by name (sweeps.params.HyperParameterSet.from_config).
    parameters = tuple(_parse_parameter(path, str(name), specs[name]) for name in sorted(specs, key=str))
    if method == "grid":
        for parameter in parameters:
            if parameter.distribution not in ("constant", "categorical", "int_uniform", "q_uniform"):
                raise SweepError(
                    path,
                    f"parameters.{parameter.name}",
                    f"a grid search needs value, values, int_uniform "
                    f"or q_uniform; {parameter.distribution} is continuous (use method: random)",
                )
            if parameter.distribution == "q_uniform" and not parameter.grid():
                raise SweepError(
                    path,
                    f"parameters.{parameter.name}",
                    "numpy.arange(min, max, q) is empty: W&B's grid takes min, min + q, ... below max (max excluded)",
                )
            if parameter.probabilities is not None:
                raise SweepError(
                    path,
                    f"parameters.{parameter.name}.probabilities",
                    "a grid search visits every value; W&B rejects probabilities there",
                )
    run_cap = document.get("run_cap")
    if run_cap is not None and not (_is_int(run_cap) and run_cap > 0):
        raise SweepError(path, "run_cap", f"must be an integer > 0, got {run_cap!r}")
    for key in ("project", "entity"):
        if key in document and not isinstance(document[key], str):
            raise SweepError(path, key, f"must be a string, got {document[key]!r}")

    command = document.get("command") or list(DEFAULT_COMMAND)  # W&B: a missing or empty command is the default
    if not isinstance(command, list) or any(isinstance(word, (dict, list)) for word in command):
        raise SweepError(path, "command", "must be a list of words")
    command = [str(word) for word in command]
    for i, word in enumerate(command):
        whole = WHOLE_MACRO.fullmatch(word)
        if whole and not ENVVAR.fullmatch(word) and whole.group(1) not in MACROS:
            supported = ", ".join("${" + m + "}" for m in MACROS)
            raise SweepError(path, f"command[{i}]", f"unknown macro {word} (supported: {supported}, ${{envvar:NAME}})")
    program = document.get("program")
    if "${program}" in command and not program:
        raise SweepError(path, "program", "missing, but the command uses ${program}")
    name = str(document.get("name") or path.stem)
    return Sweep(
        path,
        name,
        method,
        parameters,
        tuple(command),
        None if program is None else str(program),
        project=document.get("project"),
        entity=document.get("entity"),
        run_cap=run_cap,
        notes=notes,
    )


def _parse_parameter(path: Path, name: str, spec: Any) -> Parameter:
    key = f"parameters.{name}"
    if not isinstance(spec, dict):
        raise SweepError(path, key, "must be a mapping with value, values, or min/max and a distribution")
    if "parameters" in spec:
        raise SweepError(path, f"{key}.parameters", "nested parameters are not supported by the local runner")
    distribution = spec.get("distribution")
    if distribution is None:
        if "value" in spec:
            distribution = "constant"
        elif "values" in spec:
            distribution = "categorical"
        elif "min" in spec and "max" in spec:
            distribution = "int_uniform" if _is_int(spec["min"]) and _is_int(spec["max"]) else "uniform"
        else:
            raise SweepError(path, key, "needs value, values, or min and max (with an optional distribution)")
    if distribution not in DISTRIBUTION_KEYS:
        raise SweepError(
            path,
            f"{key}.distribution",
            f"{distribution!r} is not supported (supported: {', '.join(DISTRIBUTION_KEYS)})",
        )
    used = DISTRIBUTION_KEYS[distribution]
    for field in spec:
        if field != "distribution" and field not in used:
            raise SweepError(
                path, f"{key}.{field}", f"not used by a {distribution} parameter (it reads {', '.join(used)})"
            )
    for field in used:
        if field not in spec and field not in ("probabilities", "q"):
            raise SweepError(path, f"{key}.{field}", f"missing (a {distribution} parameter reads {', '.join(used)})")

    if distribution == "constant":
        return Parameter(name, distribution, values=(spec["value"],))
    if distribution == "categorical":
        values = spec["values"]
        if not isinstance(values, list) or not values:
            raise SweepError(path, f"{key}.values", f"must be a non-empty list, got {values!r}")
        probabilities = spec.get("probabilities")
        if probabilities is not None:
            if (
                not isinstance(probabilities, list)
                or len(probabilities) != len(values)
                or not all(_is_number(p) and p >= 0 for p in probabilities)
            ):
                raise SweepError(path, f"{key}.probabilities", f"must be {len(values)} numbers >= 0, one per value")
            if not math.isclose(sum(probabilities), 1.0, abs_tol=1e-6):
                raise SweepError(path, f"{key}.probabilities", f"must sum to 1, got {sum(probabilities)}")
            probabilities = tuple(float(p) for p in probabilities)
        return Parameter(name, distribution, values=tuple(values), probabilities=probabilities)

    low, high, q = spec["min"], spec["max"], spec.get("q", 1)
    for field, number in (("min", low), ("max", high), ("q", q)):
        if not _is_number(number):
            raise SweepError(path, f"{key}.{field}", f"must be a number, got {number!r}")
    if low > high:
        raise SweepError(path, f"{key}.min", f"min {low} > max {high}")
    if distribution == "int_uniform" and not (_is_int(low) and _is_int(high)):
        raise SweepError(path, f"{key}.min", f"int_uniform needs integer min and max, got {low!r} and {high!r}")
    if distribution == "log_uniform_values" and low <= 0:
        raise SweepError(path, f"{key}.min", f"log_uniform_values needs min > 0, got {low!r}")
    parameter = Parameter(name, distribution, min=low, max=high, q=q)
    if distribution == "q_uniform":
        if q <= 0:
            raise SweepError(path, f"{key}.q", f"must be > 0, got {q!r}")
        first, last = parameter._q_range()
        if first > last:
            raise SweepError(path, f"{key}.q", f"no multiple of q={q} lies in [min, max] = [{low}, {high}]")
    return parameter


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def format_value(value: Any) -> str:
    """A value as a command-line word OmegaConf reads back: true/false, null, JSON lists."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (list, dict)):
        return json.dumps(value, default=str)
    return str(value)
