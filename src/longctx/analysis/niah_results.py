"""NIAH effective-length results as tidy pandas frames (STRING §3, Figure 4, Figure 7, Table 1).

    from longctx.analysis.niah_results import load_niah, load_niah_wandb, niah_result
    frames = load_niah("runs/string_ablation")     # every niah.json below, recursively
    frames.results      # one row per evaluation: run, method, params, effective length, accuracy
    frames.per_length   # one row per (evaluation, tested length): pass rate, Wilson interval, recall
    frames.heatmap      # one row per (evaluation, depth band, length): recall (Figure 4)
    load_niah_wandb("runs/tiny_1k")                # the `longctx niah` W&B runs (e.g. a wandb sweep)
    niah_result("runs/niah/niah.json")             # back to the EffectiveLengthResult it was written from

This module owns reading back what the effective-length search (eval/effective_length.py)
wrote: `niah.json` files (`EffectiveLengthResult.to_dict`, written by `longctx niah --out
DIR` and by the training probe as `<run>/niah/step-NNNNNNN/niah.json`), and the W&B runs
`longctx niah` logs (job type "niah": config, `niah/effective_length`, and the
`niah/pass_rate` table file; no heatmap numbers).

What each evaluation was of:

- `step`: the training step of a probe file (`.../niah/step-NNNNNNN/niah.json`), else empty.
- `run`: the label given in a {label: path} mapping; else for a probe file its run
  directory's name; for other niah.json files the nearest parent directory whose name is
  not a `key=value` list; for a W&B run the name of its config's `train.out_dir` (the
  model's run directory when evaluated with the model's own experiment YAML).
- `method` and its parameters: a W&B run's config `eval.position_method`; for a niah.json
  a `position_method` entry in the file when there is one, else `key=value` pairs in the
  names of the directories it lies in, comma-separated, keys as in the config
  (`eval.position_method.string.local_window=32` or just `local_window=32`; `name=string`
  is the method), e.g. `runs/string_ablation/tiny_1k/name=string,local_window=32,shift_ratio=0.33/niah.json`;
  a `params` mapping {path: {key: value}} passed to `load_niah` overrides both. Unknown: None.

`accuracy` is the pass rate at the largest length the search was configured for,
L = max_length rounded down to the step (the model's training length by default, where
STRING Table 1 measures; NaN when the search stopped before L). `effective_length` is
the last length before the first one whose pass rate fell below the threshold (§7.2).
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from longctx.analysis import wandb_offline
from longctx.analysis.runs import expand
from longctx.eval.effective_length import EffectiveLengthResult

NIAH_FILE = "niah.json"
LENGTH_COLUMNS = ["length", "tests", "passed", "rate", "wilson_low", "wilson_high", "recall"]
ID_COLUMNS = ["source", "run", "step", "method", "label"]
RESULT_COLUMNS = [
    *ID_COLUMNS,
    *("effective_length", "accuracy", "length", "task", "tests_per_length", "pass_threshold"),
    *("failure_depth_low", "failure_depth_high"),
]
"""The columns of `NiahFrames.results` before the method parameters: a `_record`'s keys."""


@dataclass
class NiahFrames:
    results: pd.DataFrame
    """source, run, step, method, label, effective_length, accuracy, length (L of accuracy),
    task, tests_per_length, pass_threshold, failure_depth_low/high (the depth band of lowest
    recall, STRING Table 4; NaN for W&B runs), then one column per method parameter."""
    per_length: pd.DataFrame
    """source, run, step, method, label, length, tests, passed, rate, wilson_low, wilson_high, recall."""
    heatmap: pd.DataFrame
    """source, run, step, method, label, depth_low, depth_high, length, recall (NaN where no needle fell)."""

    @staticmethod
    def concat(parts: list[NiahFrames]) -> NiahFrames:
        return NiahFrames(
            *(
                pd.concat([getattr(p, name) for p in parts], ignore_index=True)
                for name in ("results", "per_length", "heatmap")
            )
        )


# --- niah.json ----------------------------------------------------------------------------


def read_result_dict(path: str | Path) -> dict:
    """The JSON of one niah.json, checked; errors name the file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist")
    text = path.read_text()
    if not text.strip():
        raise ValueError(f"{path} is empty")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not JSON ({error.msg} at line {error.lineno})") from None
    required = ("effective_length", "per_length", "config")
    missing = [key for key in required if not isinstance(data, dict) or key not in data]
    if missing:
        raise ValueError(f"{path} lacks {missing}: not a NIAH result (EffectiveLengthResult.to_dict)")
    for row in data["per_length"]:
        absent = [key for key in LENGTH_COLUMNS[:-1] if key not in row]
        if absent:
            raise ValueError(f"{path}: a per_length row lacks {absent}")
    return data


def niah_result(path: str | Path) -> EffectiveLengthResult:
    """The EffectiveLengthResult a niah.json was written from (None -> NaN), e.g. for
    `eval.effective_length.plot_heatmap` or `eval.niah.evaluation.peak_failure_depth`."""
    try:
        return EffectiveLengthResult.from_dict(read_result_dict(path))
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(f"{path} is not a complete NIAH result: {error}") from None


def niah_files(spec) -> list[Path]:
    """niah.json files named by paths/globs (comma list or iterable); directories are searched
    recursively (W&B's own folders excepted)."""
    files: list[Path] = []
    for path in expand(spec):
        found = (
            [path]
            if path.is_file()
            else sorted(p for p in path.rglob(NIAH_FILE) if "wandb" not in p.relative_to(path).parts)
        )
        files.extend(f for f in found if f not in files)
    if not files:
        raise FileNotFoundError(f"{spec} holds no {NIAH_FILE}")
    return files


def load_niah(sources, params: dict | None = None) -> NiahFrames:
    """Frames of niah.json files: a path, glob, directory, comma list, list, or {label: path}.
    `params`: {path: {key: value}} method parameters (and `name`) that override the file's."""
    params = {Path(k).resolve(): v for k, v in (params or {}).items()}
    if isinstance(sources, dict):
        labelled = [(label, f) for label, source in sources.items() for f in niah_files([source])]
    else:
        labelled = [(None, f) for f in niah_files(sources)]
    records = []
    for label, path in labelled:
        data = read_result_dict(path)
        run, step = _file_identity(path)
        method, method_params = _path_params(path)
        if isinstance(data.get("position_method"), dict):
            method, method_params = _method_params(data["position_method"], method, method_params)
        method, method_params = _method_params(params.get(path.resolve(), {}), method, method_params)
        config = data["config"]
        records.append(
            _record(
                source=str(path),
                run=label or run,
                step=step,
                method=method,
                params=method_params,
                data=data,
                top_length=_round_down(config.get("max_length"), config.get("step")),
                task=config.get("task"),
                pass_threshold=config.get("pass_threshold"),
            )
        )
    return _frames(records)


# --- W&B runs of `longctx niah` ---------------------------------------------------------------


def load_niah_wandb(sources) -> NiahFrames:
    """Frames of `longctx niah` W&B runs: `.wandb` files, `offline-run-*` directories, or
    directories whose `wandb/offline-run-*` hold them (other job types are skipped there;
    named directly, they are an error)."""
    runs: list[Path] = []
    for path in expand(sources):
        if path.suffix == ".wandb" or path.name.startswith("offline-run-"):
            job = wandb_offline.job_type(path)
            if job != "niah":
                raise ValueError(f"{path} is a W&B run of job type {job!r}, not a `longctx niah` evaluation")
            runs.append(path)
        else:
            runs.extend(
                r
                for r in wandb_offline.offline_runs(path)
                if list(r.glob("run-*.wandb")) and wandb_offline.job_type(r) == "niah"
            )
    if not runs:
        raise FileNotFoundError(f"{sources} holds no W&B run of `longctx niah` (job type niah)")
    return _frames([_wandb_record(path) for path in runs])


def _wandb_record(path: Path) -> dict:
    run_dir = path.parent if path.suffix == ".wandb" else path
    info = wandb_offline.read_run(path)
    config = info["config"]
    evaluation, model = config.get("eval", {}), config.get("model", {})
    history = wandb_offline.read_history(path)
    lengths = [row for row in history if "niah/effective_length" in row]
    if not lengths:
        raise ValueError(f"{path}: the run logged no niah/effective_length")
    per_length = []
    tables = [row["niah/pass_rate.path"] for row in history if "niah/pass_rate.path" in row]
    if tables:
        table_path = run_dir / "files" / tables[-1]
        if not table_path.is_file():
            raise FileNotFoundError(f"{path}: its pass-rate table {table_path} is missing")
        table = json.loads(table_path.read_text())
        per_length = [dict(zip(table["columns"], row, strict=True)) for row in table["data"]]
    method = evaluation.get("position_method", {})
    name = method.get("name")
    # eval.niah.* since the NIAH settings became one nested config; eval.niah_* in older runs.
    niah = evaluation.get("niah") or {
        key.removeprefix("niah_"): value
        for key, value in evaluation.items()
        if key.startswith("niah_") or key == "pass_threshold"
    }
    step = niah.get("step")
    data = {"effective_length": lengths[-1]["niah/effective_length"], "per_length": per_length}
    out_dir = config.get("train", {}).get("out_dir")
    return _record(
        source=str(path),
        run=Path(out_dir).name if out_dir else (info["name"] or info["run_id"]),
        step=None,
        method=name,
        params=dict(method.get(name, {})) if name else {},
        data=data,
        top_length=_round_down(niah.get("max_length") or model.get("max_position"), step),
        task=niah.get("task"),
        pass_threshold=niah.get("pass_threshold"),
    )


# --- shared ---------------------------------------------------------------------------------


def _file_identity(path: Path) -> tuple[str, int | None]:
    """(run label, training step) of a niah.json by where it lies."""
    parent = path.parent
    if parent.name.startswith("step-") and parent.parent.name == "niah" and parent.name[5:].isdigit():
        return parent.parent.parent.name, int(parent.name[5:])
    for directory in [parent, *parent.parents]:
        if directory.name and "=" not in directory.name:
            return directory.name, None
    return parent.name, None


def _parse_value(text: str):
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


def _path_params(path: Path) -> tuple[str | None, dict]:
    """`key=value` pairs of the directory names a niah.json lies in (outermost first)."""
    pairs: dict = {}
    for directory in reversed(path.parent.parts):
        if "=" in directory:
            for item in directory.split(","):
                key, _, value = item.partition("=")
                pairs[key.strip()] = _parse_value(value.strip())
    return _method_params(pairs, None, {})


def _method_params(given: dict, method: str | None, params: dict) -> tuple[str | None, dict]:
    """Merge `given` ({name, key: value} with config or short keys, or the config layout
    {name, <name>: {...}}) over (method, params)."""
    params = dict(params)
    for key, value in given.items():
        short = key.rsplit(".", 1)[-1]
        if short == "name":
            method = value
        elif isinstance(value, dict):
            continue  # another method's sub-config, or this one's (taken below)
        else:
            params[short] = value
    if method and isinstance(given.get(method), dict):
        params = {**given[method], **params}
    return method, params


def _round_down(length, step) -> int | None:
    if not length or not step:
        return None
    return int(length) // int(step) * int(step)


def _defaults(method: str | None) -> dict:
    from longctx.config.position_methods import PositionMethodConfig

    values = dataclasses.asdict(PositionMethodConfig())
    return values.get(method, {}) if method else {}


def method_label(method: str | None, params: dict) -> str:
    """ "string (local_window=32, shift_ratio=0.25)": the method and its non-default parameters."""
    if not method:
        return "unknown"
    defaults = _defaults(method)
    shown = [
        f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
        for k, v in sorted(params.items())
        if k not in defaults or defaults[k] != v
    ]
    return f"{method} ({', '.join(shown)})" if shown else method


def _failure_depth(data: dict) -> tuple[float, float]:
    """STRING Table 4's peak failure depth band (eval.niah.evaluation.peak_failure_depth); NaN without depth data."""
    if "depth_recall" not in data:
        return math.nan, math.nan
    from longctx.eval.niah.evaluation import peak_failure_depth

    recall = [math.nan if v is None else v for v in data["depth_recall"]]
    result = EffectiveLengthResult(
        int(data["effective_length"]), [], list(data["depth_edges"]), recall, np.zeros((0, 0))
    )
    return peak_failure_depth(result)


def _record(*, source, run, step, method, params, data, top_length, task, pass_threshold) -> dict:
    rows = data["per_length"]
    at_top = [row["rate"] for row in rows if top_length is not None and row["length"] == top_length]
    low, high = _failure_depth(data)
    return {
        "source": source,
        "run": run,
        "step": step,
        "method": method,
        "label": method_label(method, params),
        "effective_length": int(data["effective_length"]),
        "accuracy": float(at_top[0]) if at_top else math.nan,
        "length": top_length,
        "task": task,
        "tests_per_length": int(rows[0]["tests"]) if rows else None,
        "pass_threshold": pass_threshold,
        "failure_depth_low": low,
        "failure_depth_high": high,
        "params": params,
        "data": data,
    }


def _frames(records: list[dict]) -> NiahFrames:
    param_names = sorted({key for record in records for key in record["params"]})
    results, per_length, heatmap = [], [], []
    for record in records:
        ids = {key: record[key] for key in ID_COLUMNS}
        results.append(
            {
                **{k: v for k, v in record.items() if k not in ("params", "data")},
                **{name: record["params"].get(name) for name in param_names},
            }
        )
        for row in record["data"]["per_length"]:
            per_length.append({**ids, **{key: row.get(key, math.nan) for key in LENGTH_COLUMNS}})
        data = record["data"]
        if "heatmap" in data:
            edges = data["depth_edges"]
            for band, values in enumerate(data["heatmap"]):
                for length, value in zip(
                    data.get("lengths", [r["length"] for r in data["per_length"]]), values, strict=True
                ):
                    recall = math.nan if value is None else float(value)
                    heatmap.append((*ids.values(), edges[band], edges[band + 1], length, recall))
    frames = NiahFrames(
        pd.DataFrame(results, columns=[*RESULT_COLUMNS, *param_names]),
        pd.DataFrame(per_length, columns=[*ID_COLUMNS, *LENGTH_COLUMNS]),
        pd.DataFrame(heatmap, columns=[*ID_COLUMNS, "depth_low", "depth_high", "length", "recall"]),
    )
    for frame in (frames.results, frames.per_length, frames.heatmap):
        frame["step"] = frame["step"].astype("Int64")
    results = frames.results
    results[["length", "tests_per_length"]] = results[["length", "tests_per_length"]].astype("Int64")
    for name in param_names:  # integer parameters stay integers next to methods without them
        values = [record["params"][name] for record in records if name in record["params"]]
        if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            results[name] = results[name].astype("Int64")
    return frames
