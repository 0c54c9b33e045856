"""Logged history of training runs as one tidy pandas frame (docs/design.md §12).

    from longctx.analysis.runs import find_runs, load_history, wide
    runs = find_runs("runs/*")                        # run directories (glob or comma list)
    history = load_history(runs)                      # columns: run, step, metric, value
    wide(history, ["train/tokens_seen", "niah/effective_length"])   # one row per (run, step)
    load_history({"2k": "runs/tiny_2k", "4k": "entity/project/abc123"})  # labels of your choice

This module owns reading the scalar history of a run from wherever it was logged and
putting it on one step axis. A source is

- a run directory (`train.out_dir` of `longctx pretrain` / `sft`): its `metrics.jsonl`
  (`train/*` and `perf/*` at every optimizer step from `train.callbacks.training.MetricsFile`, and
  the probes' `fi/*` and `niah/*` rows at the steps they measure) is preferred; metrics it
  does not record — the probe scalars of runs made before the probes wrote there, say —
  come from the run's offline W&B files (`wandb/offline-run-*/run-*.wandb`, read by
  `wandb_offline`, no server). With no
  `metrics.jsonl` every metric comes from W&B; with neither the directory is an error.
  W&B runs whose job type is an evaluation (`longctx niah` logs with job_type "niah"
  into `train.out_dir`) are not part of the training history and are skipped.
  When W&B holds no `niah/effective_length`, the probe results the NIAH callback wrote to
  `niah/step-NNNNNNN/niah.json` supply it.
- a `.wandb` file, or an `offline-run-*` directory: that one W&B run;
- `entity/project/run_id` (not an existing path): an online run through `wandb.Api()`.

The step axis is optimizer steps completed, the `step` of `metrics.jsonl`. W&B rows carry
`trainer/global_step`, the logger step: Lightning logs the metrics of optimizer step k at
k - 1 (written before its step counter advances), and the probes log theirs on the same
axis (train/loggers.py), so every row's step is `trainer/global_step + 1`. Rows without `trainer/global_step` use W&B's `_step`. Only numeric scalars are kept (the
fields of tables and images, marked by a `<key>._type` entry, and W&B bookkeeping keys
starting with `_` are dropped). When a step is logged twice (a run resumed from an older
checkpoint redoes steps) the later value wins.
"""

from __future__ import annotations

import glob
import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

import pandas as pd

from longctx.analysis import wandb_offline
from longctx.train.resume_check import dotted

COLUMNS = ["run", "step", "metric", "value"]
METRICS_FILE = "metrics.jsonl"
EVALUATION_JOB_TYPES = ("niah",)
"""W&B job types of evaluation runs that can share a training run's directory."""
ONLINE_RUN = re.compile(r"^[\w.-]+/[\w.-]+/[\w-]+$")
"""entity/project/run_id."""
_WANDB_BOOKKEEPING = {"epoch", "trainer/global_step"}

Sources = str | Path | Iterable[str | Path] | Mapping[str, str | Path]


# --- finding runs -----------------------------------------------------------------------


def training_wandb_runs(run_dir: str | Path) -> list[Path]:
    """The offline W&B runs of a run directory that are training runs (not evaluations), oldest first."""
    return [
        run
        for run in wandb_offline.offline_runs(run_dir)
        if list(run.glob("run-*.wandb")) and wandb_offline.job_type(run) not in EVALUATION_JOB_TYPES
    ]


def is_run_dir(path: str | Path) -> bool:
    """A directory holding a run's metrics: metrics.jsonl, f(i) snapshots or an offline W&B training run."""
    path = Path(path)
    return path.is_dir() and (
        (path / METRICS_FILE).is_file() or (path / "fi").is_dir() or bool(training_wandb_runs(path))
    )


def expand(spec: str | Path | Iterable[str | Path]) -> list[Path]:
    """Paths named by a path, a list of them, or a comma-separated string of paths and globs
    (`**` allowed; a string that is an existing path is taken whole, commas and all), in
    order, without duplicates. A pattern that matches nothing is an error naming it."""
    if isinstance(spec, Path) or (isinstance(spec, str) and Path(spec).exists()):
        items = [str(spec)]
    elif isinstance(spec, str):
        items = [item.strip() for item in spec.split(",")]
    else:
        items = [str(item) for item in spec]
    paths: list[Path] = []
    for item in filter(None, items):
        matches = sorted(glob.glob(item, recursive=True)) if glob.has_magic(item) else [item]
        if not matches or not Path(matches[0]).exists():
            raise FileNotFoundError(f"{item} matches no file or directory")
        paths.extend(Path(match) for match in matches if Path(match) not in paths)
    return paths


def find_runs(spec: str | Iterable[str | Path]) -> list[Path]:
    """The run directories among `expand(spec)` (e.g. "runs/*": every run under runs/)."""
    runs = [path for path in expand(spec) if is_run_dir(path)]
    if not runs:
        raise FileNotFoundError(f"{spec} names no run directory (one with {METRICS_FILE}, wandb/offline-run-* or fi/)")
    return runs


# --- loading ----------------------------------------------------------------------------


def load_history(sources: Sources, *, prefer: str = "auto") -> pd.DataFrame:
    """Tidy history of one or more runs: columns run (label), step (int), metric, value (float).

    `sources`: a source or a list of them (labelled by directory name, run id or the
    online path), or a {label: source} mapping. `prefer`: "auto" (see the module
    docstring), "metrics" (metrics.jsonl only) or "wandb" (the offline W&B runs only).
    """
    if prefer not in ("auto", "metrics", "wandb"):
        raise ValueError(f"prefer must be auto, metrics or wandb, got {prefer!r}")
    labelled = label_sources(sources)
    frames = [_records_frame(label, _source_records(source, prefer)) for label, source in labelled.items()]
    history = pd.concat(frames, ignore_index=True) if frames else _records_frame("", [])
    return history.sort_values(["run", "metric", "step"], kind="stable", ignore_index=True)


def wide(history: pd.DataFrame, metrics: Iterable[str] | None = None) -> pd.DataFrame:
    """One row per (run, step), one column per metric (NaN where a step did not log it)."""
    if metrics is not None:
        metrics = list(metrics)
        history = history[history["metric"].isin(metrics)]
    table = history.pivot_table(index=["run", "step"], columns="metric", values="value", aggfunc="last")
    if metrics is not None:
        table = table.reindex(columns=metrics)
    table.columns.name = None
    return table.reset_index()


def recorded_configs(run_dirs: Sources, section: str) -> list[tuple[str, dict]]:
    """(label, experiment config) of each run directory, as its checkpoints/last.ckpt
    recorded it; raises naming the run or file that lacks the checkpoint or `section`."""
    from longctx.model.checkpoint import experiment_settings

    configs = []
    for label, run_dir in label_sources(run_dirs).items():
        path = Path(run_dir) / "checkpoints" / "last.ckpt"
        if not path.is_file():
            raise FileNotFoundError(f"{run_dir} has no checkpoints/last.ckpt to read its {section} config from")
        experiment = experiment_settings(path)
        if experiment is None or section not in experiment:
            raise ValueError(f"{path}: its recorded experiment config holds no {section} section")
        configs.append((label, experiment))
    return configs


def label_sources(sources: Sources) -> dict[str, str | Path]:
    """{label: source}: a mapping as given; otherwise each source labelled by its run
    directory's name (a `.wandb` file by its run id, an online run by its path)."""
    if isinstance(sources, Mapping):
        return {str(label): source for label, source in sources.items()}
    if isinstance(sources, (str, Path)):
        sources = [sources]
    labelled: dict[str, str | Path] = {}
    for source in sources:
        label = _default_label(source)
        if label in labelled:
            raise ValueError(
                f"two sources are both labelled {label!r} ({labelled[label]} and {source}); "
                "pass a {label: source} mapping"
            )
        labelled[label] = source
    return labelled


def _default_label(source: str | Path) -> str:
    path = Path(source)
    if path.exists():
        path = path.resolve()
        if path.suffix == ".wandb":
            return path.stem.removeprefix("run-")
        if path.name == METRICS_FILE:
            return path.parent.name
        if path.name.startswith("offline-run-") and path.parent.name == "wandb":
            return path.parent.parent.name
        return path.name
    return str(source)


def _source_records(source: str | Path, prefer: str) -> list[tuple[int, str, float]]:
    path = Path(source)
    if not path.exists():
        if isinstance(source, str) and ONLINE_RUN.match(source) and prefer != "metrics":
            return _online_records(source)
        raise FileNotFoundError(f"{source} does not exist (nor is it an online run id entity/project/run_id)")
    if path.is_file():
        if path.name == METRICS_FILE:
            return _metrics_records(path)
        if path.suffix == ".wandb":
            return _wandb_records(wandb_offline.read_history(path))
        raise ValueError(f"{path} is neither a run directory, {METRICS_FILE} nor a .wandb file")
    if path.name.startswith("offline-run-"):
        return _wandb_records(wandb_offline.read_history(path))
    return _run_dir_records(path, prefer)


def _run_dir_records(run_dir: Path, prefer: str) -> list[tuple[int, str, float]]:
    metrics_file = run_dir / METRICS_FILE
    wandb_runs = training_wandb_runs(run_dir)
    use_metrics = prefer in ("auto", "metrics") and metrics_file.is_file()
    use_wandb = prefer == "wandb" or (prefer == "auto" and wandb_runs)
    if prefer == "metrics" and not use_metrics:
        raise FileNotFoundError(f"{run_dir} has no {METRICS_FILE}")
    if prefer == "wandb" and not wandb_runs:
        raise FileNotFoundError(f"{run_dir} has no offline W&B training run (wandb/offline-run-*/run-*.wandb)")
    if not use_metrics and not wandb_runs:
        raise FileNotFoundError(f"{run_dir} has neither {METRICS_FILE} nor an offline W&B run (wandb/offline-run-*)")
    records = _metrics_records(metrics_file) if use_metrics else []
    if use_wandb:
        known = {metric for _, metric, _ in records}
        for run in wandb_runs:  # oldest first: a resumed run's rows come later and win
            records.extend(r for r in _wandb_records(wandb_offline.read_history(run)) if r[1] not in known)
    if prefer == "auto" and not any(metric == "niah/effective_length" for _, metric, _ in records):
        records.extend(_probe_records(run_dir))
    return records


def _metrics_records(path: Path) -> list[tuple[int, str, float]]:
    records: list[tuple[int, str, float]] = []
    lines = path.read_text().splitlines()
    if not any(line.strip() for line in lines):
        raise ValueError(f"{path} is empty: the run logged no optimizer step")
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}:{number}: not a JSON line ({error.msg})") from None
        if not isinstance(row, dict) or not isinstance(row.get("step"), int):
            raise ValueError(f"{path}:{number}: expected an object with an integer 'step', got {line[:80]!r}")
        records.extend(
            (row["step"], key, float(value)) for key, value in row.items() if key != "step" and _scalar(value)
        )
    return records


def _wandb_records(rows: Iterable[dict]) -> list[tuple[int, str, float]]:
    records: list[tuple[int, str, float]] = []
    for row in rows:
        if "trainer/global_step" in row:
            step = int(row["trainer/global_step"]) + 1
        elif "_step" in row:
            step = int(row["_step"])
        else:
            continue
        media = tuple(key[: -len("_type")] for key in row if key.endswith("._type"))  # tables, images
        records.extend(
            (step, key, float(value))
            for key, value in row.items()
            if _scalar(value)
            and not key.startswith("_")
            and key not in _WANDB_BOOKKEEPING
            and not (media and key.startswith(media))
        )
    return records


def _probe_records(run_dir: Path) -> list[tuple[int, str, float]]:
    """niah/effective_length from the NIAH callback's niah/step-NNNNNNN/niah.json files."""
    records = []
    for path in sorted(run_dir.glob("niah/step-*/niah.json")):
        step = int(path.parent.name.removeprefix("step-"))
        try:
            records.append((step, "niah/effective_length", float(json.loads(path.read_text())["effective_length"])))
        except (json.JSONDecodeError, KeyError, TypeError):
            raise ValueError(f"{path} is not a NIAH result (niah.json with an effective_length)") from None
    return records


def _online_records(run_path: str) -> list[tuple[int, str, float]]:
    import wandb

    run = wandb.Api().run(run_path)
    return _wandb_records(dotted(row) for row in run.scan_history())


def _scalar(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _records_frame(label: str, records: list[tuple[int, str, float]]) -> pd.DataFrame:
    frame = pd.DataFrame(records, columns=["step", "metric", "value"])
    frame = frame.drop_duplicates(["step", "metric"], keep="last")
    frame.insert(0, "run", label)
    return frame.astype({"run": str, "step": "int64", "metric": str, "value": "float64"})
