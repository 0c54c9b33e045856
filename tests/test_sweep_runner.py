"""`longctx sweep`: grid and random points, W&B macro expansion, real runs, failures, signals, errors."""

import itertools
import json
import math
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from longctx.cli import main
from longctx.sweep import SweepError, expand_command, format_value, load_sweep, plan
from tests.helpers import wandb_grid

SWEEPS = sorted(Path("sweeps").glob("*.yaml"))
# Appends [argv, WANDB_RUN_GROUP, LONGCTX_SWEEP_POINT] to $SWEEP_LOG; exits 3 when "fail=true" is an argument.
RECORDER = (
    "import json, os, sys; "
    "open(os.environ['SWEEP_LOG'], 'a').write(json.dumps([sys.argv[1:], os.environ['WANDB_RUN_GROUP'], "
    "os.environ['LONGCTX_SWEEP_POINT']]) + '\\n'); "
    "sys.exit(3 if 'fail=true' in sys.argv else 0)"
)


def write_sweep(path: Path, document: dict) -> Path:
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def recorder_sweep(tmp_path: Path, parameters: dict, name: str = "tiny") -> Path:
    return write_sweep(
        tmp_path / "tiny_sweep.yaml",
        {
            "name": name,
            "method": "grid",
            "parameters": parameters,
            "command": ["${env}", "${interpreter}", "-c", RECORDER, "${args_no_hyphens}"],
        },
    )


def read_jsonl(path: Path) -> list:
    return [json.loads(line) for line in path.read_text().splitlines()]


# --- grid ---------------------------------------------------------------------------------


@pytest.mark.parametrize("path", SWEEPS, ids=[p.stem for p in SWEEPS])
def test_grid_points_are_the_cartesian_product_in_wandb_order(path):
    document = yaml.safe_load(path.read_text())
    names = sorted(document["parameters"])  # W&B's engine sorts the names; the last varies fastest
    choices = [document["parameters"][n].get("values", [document["parameters"][n].get("value")]) for n in names]
    expected = [dict(zip(names, combo, strict=True)) for combo in itertools.product(*choices)]
    points = plan(load_sweep(path))
    assert [p.arguments for p in points] == expected
    assert [p.index for p in points] == list(range(len(expected)))
    fixed = document["command"][2:-1]  # between ${interpreter} and ${args_no_hyphens}
    assert [p.command for p in points] == [[sys.executable, *fixed, *args] for args in wandb_grid(document)]
    assert [p.arguments for p in plan(load_sweep(path), count=3)] == expected[:3]


def test_grid_enumerates_int_and_q_uniform(tmp_path):
    path = write_sweep(
        tmp_path / "s.yaml",
        {
            "method": "grid",
            "command": ["${args}"],
            "parameters": {
                "x": {"distribution": "q_uniform", "min": 0.1, "max": 0.35, "q": 0.1},
                "n": {"distribution": "int_uniform", "min": 2, "max": 4},
                "k": {"distribution": "q_uniform", "min": 1, "max": 9, "q": 4},
            },
        },
    )
    # W&B: int_uniform is range(min, max + 1); q_uniform is numpy.arange(min, max, q), max
    # excluded, values as arange computes them (min + i * q: 0.1 + 2 * 0.1 = 0.30000000000000004)
    assert [p.arguments for p in plan(load_sweep(path))] == [
        {"k": k, "n": n, "x": x} for k in (1, 5) for n in (2, 3, 4) for x in (0.1, 0.2, 0.1 + 2 * 0.1)
    ]


def test_skipalign_grid_varies_the_variant_first():
    """The issue's case: `--count 6` used to run six `normal` points (identical trainings)."""
    points = plan(load_sweep("sweeps/skipalign.yaml"), count=6)
    assert [(p.arguments["sft.strategy"], p.arguments["sft.variant"]) for p in points] == [
        ("all", "normal"),
        ("all", "packed"),
        ("all", "skipalign"),
        ("inner", "normal"),
        ("inner", "packed"),
        ("inner", "skipalign"),
    ]
    assert {(p.arguments["sft.extended_length"], p.arguments["sft.p"]) for p in points} == {(2048, 0.25)}
    assert points[0].command[-5:] == [
        "init=runs/tiny_512/checkpoints/last.ckpt",
        "sft.extended_length=2048",
        "sft.p=0.25",
        "sft.strategy=all",
        "sft.variant=normal",
    ]


def test_grid_order_follows_wandbs_name_sort(tmp_path):
    """Hand-worked, checked against W&B's engine: Python's sort of the names (upper case and
    `_` before lower case), constants inside the order, values that hash alike once (at the
    first one's place, with the last one's value)."""
    path = write_sweep(
        tmp_path / "s.yaml",
        {
            "method": "grid",
            "command": ["${args}"],
            "parameters": {
                "b": {"values": [1, 2]},
                "a": {"values": ["x", "y"]},
                "_c": {"value": 0},
                "B": {"values": [7, 7.0]},
            },
        },
    )
    points = plan(load_sweep(path))
    assert [list(p.arguments) for p in points] == [["B", "_c", "a", "b"]] * 4
    assert [p.arguments for p in points] == [{"B": 7.0, "_c": 0, "a": a, "b": b} for a in "xy" for b in (1, 2)]
    assert points[1].command == ["--B=7.0", "--_c=0", "--a=x", "--b=2"]


def test_run_cap_caps_the_points_like_count(tmp_path):
    document = {"method": "grid", "command": ["${args}"], "parameters": {"a": {"values": [1, 2, 3, 4]}}, "run_cap": 3}
    sweep = load_sweep(write_sweep(tmp_path / "s.yaml", document))
    assert [p.arguments["a"] for p in plan(sweep)] == [1, 2, 3]
    assert [p.arguments["a"] for p in plan(sweep, count=2)] == [1, 2]
    assert [p.arguments["a"] for p in plan(sweep, count=10)] == [1, 2, 3]


# --- random -------------------------------------------------------------------------------

RANDOM = {
    "lr": {"distribution": "log_uniform_values", "min": 1e-6, "max": 1.0},
    "dropout": {"distribution": "uniform", "min": 0.0, "max": 0.3},
    "layers": {"distribution": "int_uniform", "min": 2, "max": 8},
    "step": {"distribution": "q_uniform", "min": 0, "max": 100, "q": 25},
    "batch": {"values": [8, 16, 32]},
    "optimizer": {"values": ["adamw", "sgd"], "probabilities": [0.9, 0.1]},
    "never": {"distribution": "categorical", "values": ["a", "b"], "probabilities": [1.0, 0.0]},
    "fixed": {"value": "x"},
    "constant": {"distribution": "constant", "value": 7},
    "inferred_int": {"min": 1, "max": 3},
    "inferred_float": {"min": 1, "max": 3.5},
}


@pytest.fixture
def random_sweep(tmp_path):
    return load_sweep(
        write_sweep(
            tmp_path / "random.yaml",
            {"method": "random", "parameters": RANDOM, "command": ["${interpreter}", "${args_no_hyphens}"]},
        )
    )


def test_random_draws_are_reproducible_and_seeded(random_sweep):
    first = [p.arguments for p in plan(random_sweep, count=20, seed=0)]
    assert first == [p.arguments for p in plan(random_sweep, count=20, seed=0)]
    assert first != [p.arguments for p in plan(random_sweep, count=20, seed=1)]
    assert [p.arguments for p in plan(random_sweep, count=5, seed=0)] == first[:5]
    assert list(first[0]) == sorted(RANDOM)  # W&B's order: names sorted


def test_random_draws_stay_within_bounds_and_choices(random_sweep):
    draws = [p.arguments for p in plan(random_sweep, count=1000, seed=3)]
    for d in draws:
        assert 1e-6 <= d["lr"] <= 1.0 and 0.0 <= d["dropout"] <= 0.3
        assert type(d["layers"]) is int and 2 <= d["layers"] <= 8
        assert type(d["step"]) is int and d["step"] in (0, 25, 50, 75, 100)
        assert d["batch"] in (8, 16, 32) and d["optimizer"] in ("adamw", "sgd") and d["never"] == "a"
        assert d["fixed"] == "x" and d["constant"] == 7
        assert type(d["inferred_int"]) is int and 1 <= d["inferred_int"] <= 3
        assert type(d["inferred_float"]) is float and 1 <= d["inferred_float"] <= 3.5
    assert {d["layers"] for d in draws} == set(range(2, 9))  # max is inclusive
    assert {d["step"] for d in draws} == {0, 25, 50, 75, 100}
    assert {d["batch"] for d in draws} == {8, 16, 32}
    assert 0.85 < sum(d["optimizer"] == "adamw" for d in draws) / len(draws) < 0.95


def test_log_uniform_values_spread_evenly_in_log_space(random_sweep):
    exponents = [math.log10(p.arguments["lr"]) for p in plan(random_sweep, count=1200, seed=0)]
    per_decade = [sum(-k - 1 <= e < -k for e in exponents) / len(exponents) for k in range(6)]
    assert all(0.12 < share < 0.22 for share in per_decade), per_decade  # 1/6 each; uniform in value: 0.9, 0.09, ...


def test_random_needs_count(random_sweep, capsys):
    with pytest.raises(SweepError, match="method: .*--count"):
        plan(random_sweep)
    assert main(["sweep", "--dry-run", str(random_sweep.path)]) == 2
    assert "--count" in capsys.readouterr().err


# --- macros -------------------------------------------------------------------------------


def test_macros_expand_as_specified(tmp_path, monkeypatch):
    monkeypatch.setenv("SWEEP_TEST_DIR", "/data")
    path = write_sweep(
        tmp_path / "m.yaml",
        {
            "method": "grid",
            "program": "train.py",
            "parameters": {"a": {"value": 1}},
            "command": [
                "${env}",
                "${interpreter}",
                "${program}",
                "--root=${envvar:SWEEP_TEST_DIR}",
                "${args}",
                "${args_no_hyphens}",
                "${args_json}",
                "${args_no_boolean_flags}",
                "${args_no_equals}",
                "${args_append_hydra}",
                "${args_override_hydra}",
                "x=${data.window}",
            ],
        },
    )
    arguments = {
        "on": True,
        "off": False,
        "lr": 1e-05,
        "p": 0.1,
        "n": 3,
        "name": "a b",
        "none": None,
        "sizes": [1, "x"],
    }
    words = expand_command(load_sweep(path), arguments)
    values = ["true", "false", "1e-05", "0.1", "3", "a b", "null", '[1, "x"]']
    assert words == [
        sys.executable,
        "train.py",
        "--root=/data",
        *[f"--{k}={v}" for k, v in zip(arguments, values, strict=True)],
        *[f"{k}={v}" for k, v in zip(arguments, values, strict=True)],
        '{"on": true, "off": false, "lr": 1e-05, "p": 0.1, "n": 3, "name": "a b", "none": null, "sizes": [1, "x"]}',
        "--on",
        *[f"--{k}={v}" for k, v in list(zip(arguments, values, strict=True))[2:]],
        *[w for k, v in zip(arguments, values, strict=True) for w in (f"--{k}", v)],
        *[f"+{k}={v}" for k, v in zip(arguments, values, strict=True)],
        *[f"++{k}={v}" for k, v in zip(arguments, values, strict=True)],
        "x=${data.window}",  # not a whole-word macro: passed on, for OmegaConf to interpolate
    ]
    assert format_value(True) == "true" and format_value(None) == "null" and format_value({"a": [1]}) == '{"a": [1]}'


def test_argument_macros_match_the_wandb_agent(tmp_path):
    """The agent's own formatter, for values where our only difference (booleans' case, None, lists) is absent."""
    from wandb.sdk.launch.sweeps.utils import create_sweep_command_args

    arguments = {"lr": 1e-05, "p": 0.1, "big": 1e20, "n": -3, "name": "run a", "flag": True, "off": False}
    reference = create_sweep_command_args({"args": {k: {"value": v} for k, v in arguments.items()}})
    for macro in (
        "args",
        "args_no_hyphens",
        "args_no_equals",
        "args_no_boolean_flags",
        "args_json",
        "args_append_hydra",
        "args_override_hydra",
    ):
        path = write_sweep(
            tmp_path / "w.yaml", {"method": "grid", "parameters": {"a": {"value": 1}}, "command": ["${" + macro + "}"]}
        )
        expected = [w.replace("=True", "=true").replace("=False", "=false") for w in reference[macro]]
        if macro == "args_no_equals":
            expected = [{"True": "true", "False": "false"}.get(w, w) for w in expected]
        assert expand_command(load_sweep(path), arguments) == expected, macro


def test_default_command_is_wandbs(tmp_path):
    path = write_sweep(
        tmp_path / "d.yaml", {"method": "grid", "program": "train.py", "parameters": {"a": {"values": [1]}}}
    )
    assert plan(load_sweep(path))[0].command == [sys.executable, "train.py", "--a=1"]


# --- real runs ----------------------------------------------------------------------------


def test_every_point_runs_once_with_its_arguments(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SWEEP_LOG", str(tmp_path / "log.jsonl"))
    path = recorder_sweep(
        tmp_path, {"a": {"values": [1, 2]}, "flag": {"values": [True, False]}, "lr": {"value": 0.001}}
    )
    summary = tmp_path / "out" / "summary.jsonl"
    assert main(["sweep", str(path), "--summary", str(summary)]) == 0
    expected = [
        ["a=1", "flag=true", "lr=0.001"],
        ["a=1", "flag=false", "lr=0.001"],
        ["a=2", "flag=true", "lr=0.001"],
        ["a=2", "flag=false", "lr=0.001"],
    ]
    assert read_jsonl(tmp_path / "log.jsonl") == [[args, "tiny", str(i)] for i, args in enumerate(expected)]
    records = read_jsonl(summary)
    assert [r["index"] for r in records] == [0, 1, 2, 3] and [r["returncode"] for r in records] == [0] * 4
    assert [r["arguments"] for r in records] == [
        {"a": a, "flag": f, "lr": 0.001} for a in (1, 2) for f in (True, False)
    ]
    assert [r["command"] for r in records] == [[sys.executable, "-c", RECORDER, *args] for args in expected]
    assert all(r["seconds"] >= 0 and r["signal"] is None for r in records)
    assert "4/4 runs succeeded" in capsys.readouterr().out


def test_summary_defaults_to_runs_sweeps_and_group_to_the_file_stem(tmp_path, monkeypatch):
    monkeypatch.setenv("SWEEP_LOG", str(tmp_path / "log.jsonl"))
    path = write_sweep(
        tmp_path / "stem_name.yaml",
        {
            "method": "grid",
            "parameters": {"a": {"value": 5}},
            "command": ["${interpreter}", "-c", RECORDER, "${args_no_hyphens}"],
        },
    )
    monkeypatch.chdir(tmp_path)
    assert main(["sweep", str(path)]) == 0
    assert read_jsonl(tmp_path / "log.jsonl") == [[["a=5"], "stem_name", "0"]]
    assert [r["arguments"] for r in read_jsonl(tmp_path / "runs/sweeps/stem_name/summary.jsonl")] == [{"a": 5}]


@pytest.mark.parametrize("keep_going", [False, True])
def test_a_failing_point_stops_the_sweep_unless_keep_going(tmp_path, monkeypatch, keep_going):
    monkeypatch.setenv("SWEEP_LOG", str(tmp_path / "log.jsonl"))
    path = recorder_sweep(tmp_path, {"fail": {"values": [False, True]}, "a": {"values": [1, 2]}})
    summary = tmp_path / "summary.jsonl"
    assert main(["sweep", str(path), "--summary", str(summary), *(["--keep-going"] if keep_going else [])]) == 1
    ran = 4 if keep_going else 2
    assert [entry[0] for entry in read_jsonl(tmp_path / "log.jsonl")] == [
        ["a=1", "fail=false"],
        ["a=1", "fail=true"],
        ["a=2", "fail=false"],
        ["a=2", "fail=true"],
    ][:ran]
    assert [r["returncode"] for r in read_jsonl(summary)] == [0, 3, 0, 3][:ran]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_is_forwarded_to_the_child_and_stops_the_sweep(tmp_path, signum):
    child = (
        "import os, signal, sys, time; "
        "signal.signal(signal.SIGTERM, lambda *a: sys.exit(5)); signal.signal(signal.SIGINT, lambda *a: sys.exit(6)); "
        "open(os.environ['STARTED'], 'w').close(); time.sleep(30)"
    )
    path = write_sweep(
        tmp_path / "s.yaml",
        {
            "method": "grid",
            "parameters": {"a": {"values": [1, 2]}},
            "command": ["${interpreter}", "-c", child, "${args_no_hyphens}"],
        },
    )
    summary, started = tmp_path / "summary.jsonl", tmp_path / "started"
    runner = (
        "import sys; from longctx.sweep import load_sweep, plan, run; "
        f"s = load_sweep({str(path)!r}); sys.exit(run(s, plan(s), {str(summary)!r}))"
    )
    process = subprocess.Popen([sys.executable, "-c", runner], env={**os.environ, "STARTED": str(started)})
    try:
        deadline = time.monotonic() + 10
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        process.send_signal(signum)  # to the runner only: the child sees it only if forwarded
        assert process.wait(timeout=10) == 128 + signum
    finally:
        if process.poll() is None:
            process.kill()
    [record] = read_jsonl(summary)  # point 1 never started
    assert record["returncode"] == (5 if signum == signal.SIGTERM else 6)
    assert record["signal"] == signum.name and record["arguments"] == {"a": 1}


# Sleeps `a` tenths of a second between writing "start" and "end" lines (monotonic time, pid,
# OMP_NUM_THREADS) to $SWEEP_LOG; prints a line to its console; exits 3 when `a` is odd.
TIMED = (
    "import json, os, sys, time; a = dict(w.split('=') for w in sys.argv[1:]); "
    "log = lambda what: open(os.environ['SWEEP_LOG'], 'a').write(json.dumps([what, a['a'], time.monotonic(), "
    "os.environ.get('OMP_NUM_THREADS')]) + '\\n'); "
    "log('start'); print('console of point', a['a']); time.sleep(int(a['a']) / 10); log('end'); "
    "sys.exit(3 if int(a['a']) % 2 else 0)"
)


def timed_sweep(tmp_path: Path, parameters: dict) -> Path:
    return write_sweep(
        tmp_path / "timed.yaml",
        {"method": "grid", "parameters": parameters, "command": ["${interpreter}", "-c", TIMED, "${args_no_hyphens}"]},
    )


def most_at_once(events: list) -> int:
    """The largest number of points between their "start" and "end" at one time."""
    level, peak = 0, 0
    for what, *_ in sorted(events, key=lambda e: (e[2], e[0] == "start")):
        level += 1 if what == "start" else -1
        peak = max(peak, level)
    return peak


@pytest.mark.parametrize("jobs", [1, 2, 3])
def test_jobs_bounds_the_points_running_at_once(tmp_path, monkeypatch, jobs):
    monkeypatch.setenv("SWEEP_LOG", str(tmp_path / "log.jsonl"))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    summary = tmp_path / "out" / "summary.jsonl"
    path = timed_sweep(tmp_path, {"a": {"values": [2, 4, 6, 8]}})
    assert main(["sweep", str(path), "--summary", str(summary), "--jobs", str(jobs)]) == 0
    events = read_jsonl(tmp_path / "log.jsonl")
    assert most_at_once(events) == jobs
    assert sorted(r["index"] for r in read_jsonl(summary)) == [0, 1, 2, 3]
    threads = {e[3] for e in events}
    assert threads == ({None} if jobs == 1 else {str(max(1, len(os.sched_getaffinity(0)) // jobs))})
    if jobs > 1:  # each point's console in its own log, named in the summary
        for record in read_jsonl(summary):
            log = Path(record["log"])
            assert log.parent == summary.parent
            assert log.read_text().strip() == f"console of point {record['arguments']['a']}"


def test_jobs_keeps_the_callers_thread_count(tmp_path, monkeypatch):
    monkeypatch.setenv("SWEEP_LOG", str(tmp_path / "log.jsonl"))
    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    path = timed_sweep(tmp_path, {"a": {"values": [2, 4]}})
    assert main(["sweep", str(path), "--summary", str(tmp_path / "s.jsonl"), "--jobs", "2"]) == 0
    assert {e[3] for e in read_jsonl(tmp_path / "log.jsonl")} == {"7"}


@pytest.mark.parametrize("keep_going", [False, True])
def test_with_jobs_a_failure_stops_the_launching_but_not_the_running(tmp_path, monkeypatch, keep_going):
    monkeypatch.setenv("SWEEP_LOG", str(tmp_path / "log.jsonl"))
    summary = tmp_path / "summary.jsonl"
    # a=1 fails after 0.1 s while a=8 runs on for 0.8 s; a=2 and a=4 wait for a free slot
    path = timed_sweep(tmp_path, {"a": {"values": [1, 8, 2, 4]}})
    argv = ["sweep", str(path), "--summary", str(summary), "--jobs", "2"]
    assert main(argv + (["--keep-going"] if keep_going else [])) == 1
    records = read_jsonl(summary)
    ran = {r["arguments"]["a"]: r["returncode"] for r in records}
    assert ran == ({1: 3, 8: 0, 2: 0, 4: 0} if keep_going else {1: 3, 8: 0})
    assert [r["arguments"]["a"] for r in records][:1] == [1]  # recorded as it ends, not in grid order


def test_with_jobs_a_signal_reaches_every_running_child(tmp_path):
    child = (
        "import os, signal, sys, time; "
        "signal.signal(signal.SIGTERM, lambda *a: sys.exit(5)); "
        "open(os.environ['STARTED'] + sys.argv[1], 'w').close(); time.sleep(30)"
    )
    path = write_sweep(
        tmp_path / "s.yaml",
        {
            "method": "grid",
            "parameters": {"a": {"values": [1, 2, 3]}},
            "command": ["${interpreter}", "-c", child, "${args_no_hyphens}"],
        },
    )
    summary, started = tmp_path / "summary.jsonl", tmp_path / "started-"
    runner = (
        "import sys; from longctx.sweep import load_sweep, plan, run; "
        f"s = load_sweep({str(path)!r}); sys.exit(run(s, plan(s), {str(summary)!r}, jobs=2))"
    )
    process = subprocess.Popen([sys.executable, "-c", runner], env={**os.environ, "STARTED": str(started)})
    try:
        deadline = time.monotonic() + 20
        while len(list(tmp_path.glob("started-*"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 128 + signal.SIGTERM
    finally:
        if process.poll() is None:
            process.kill()
    records = read_jsonl(summary)  # point a=3 never started
    assert sorted(r["arguments"]["a"] for r in records) == [1, 2]
    assert [r["returncode"] for r in records] == [5, 5] and {r["signal"] for r in records} == {"SIGTERM"}


# --- errors -------------------------------------------------------------------------------

GOOD = {"method": "grid", "parameters": {"lr": {"values": [0.1]}}, "command": ["${interpreter}", "${args}"]}
BAD = [
    ("missing parameters", {"parameters": None}, "parameters"),
    ("unknown method", {"method": "hyperband"}, "method"),
    ("bayes", {"method": "bayes"}, "method"),
    ("unknown top-level key", {"strategy": "x"}, "strategy"),
    ("spec without values", {"parameters": {"lr": {"q": 2}}}, "parameters.lr"),
    ("spec not a mapping", {"parameters": {"lr": [0.1]}}, "parameters.lr"),
    ("min > max", {"method": "random", "parameters": {"lr": {"min": 0.5, "max": 0.1}}}, "parameters.lr.min"),
    (
        "unsupported distribution",
        {"method": "random", "parameters": {"lr": {"distribution": "normal", "min": 0, "max": 1}}},
        "parameters.lr.distribution",
    ),
    (
        "unused spec key",
        {"method": "random", "parameters": {"lr": {"min": 0.0, "max": 1.0, "mu": 0}}},
        "parameters.lr.mu",
    ),
    (
        "log of zero",
        {"method": "random", "parameters": {"lr": {"distribution": "log_uniform_values", "min": 0, "max": 1}}},
        "parameters.lr.min",
    ),
    (
        "int_uniform of floats",
        {"method": "random", "parameters": {"n": {"distribution": "int_uniform", "min": 0.5, "max": 2}}},
        "parameters.n.min",
    ),
    ("empty values", {"parameters": {"lr": {"values": []}}}, "parameters.lr.values"),
    (
        "probabilities length",
        {"parameters": {"lr": {"values": [1, 2], "probabilities": [1.0]}}},
        "parameters.lr.probabilities",
    ),
    (
        "probabilities sum",
        {"parameters": {"lr": {"values": [1, 2], "probabilities": [0.5, 0.6]}}},
        "parameters.lr.probabilities",
    ),
    ("continuous grid", {"parameters": {"lr": {"min": 0.1, "max": 0.2}}}, "parameters.lr"),
    (
        "probabilities in a grid",
        {"parameters": {"lr": {"values": [1, 2], "probabilities": [0.5, 0.5]}}},
        "parameters.lr.probabilities",
    ),
    (
        "empty q_uniform grid",
        {"parameters": {"lr": {"distribution": "q_uniform", "min": 1, "max": 1, "q": 1}}},
        "parameters.lr",
    ),
    ("run_cap zero", {"run_cap": 0}, "run_cap"),
    ("project not a string", {"project": ["a"]}, "project"),
    ("custom", {"method": "custom"}, "method"),
    ("nested parameters", {"parameters": {"opt": {"parameters": {"lr": {"value": 1}}}}}, "parameters.opt.parameters"),
    ("unknown macro", {"command": ["${interpreter}", "${argz}"]}, "command[1]"),
    ("program missing", {"command": ["${interpreter}", "${program}", "${args}"]}, "program"),
]


@pytest.mark.parametrize("change,key", [(c, k) for _, c, k in BAD], ids=[i for i, _, _ in BAD])
def test_bad_sweep_files_name_the_file_and_key(tmp_path, capsys, change, key):
    path = write_sweep(tmp_path / "bad.yaml", {k: v for k, v in {**GOOD, **change}.items() if v is not None})
    with pytest.raises(SweepError) as error:
        load_sweep(path)
    assert error.value.key == key and str(error.value).startswith(f"{path}: {key}: ")
    assert main(["sweep", "--dry-run", str(path)]) == 2
    assert capsys.readouterr().err.startswith(f"longctx sweep: error: {path}: {key}: ")


def test_bayes_error_points_to_wandb(tmp_path):
    with pytest.raises(SweepError, match="wandb agent"):
        load_sweep(write_sweep(tmp_path / "b.yaml", {**GOOD, "method": "bayes"}))


def test_keys_wandb_defines_are_accepted(tmp_path, capsys):
    """Every top-level key of W&B's sweep schema (wandb/sweeps config/schema.json)."""
    extra = {
        "apiVersion": "v1",
        "kind": "sweep",
        "controller": {"type": "local"},
        "description": "d",
        "program": "p.py",
        "job": "j",
        "image_uri": "i",
        "entity": "e",
        "project": "p",
        "name": "n",
        "run_cap": 5,
        "metric": {"name": "loss", "goal": "minimize"},
        "metrics": [{"name": "a"}, {"name": "b"}],
        "scheduler": {"engine": "wandb"},
        "early_terminate": {"type": "hyperband", "min_iter": 3},
    }
    path = write_sweep(tmp_path / "ok.yaml", {**GOOD, **extra})
    sweep = load_sweep(path)
    assert (sweep.name, sweep.project, sweep.entity, sweep.run_cap) == ("n", "p", "e", 5)
    assert main(["sweep", "--dry-run", str(path)]) == 0
    notes = capsys.readouterr().err.splitlines()
    assert [line.split(":")[2].strip() for line in notes] == [
        "controller",
        "early_terminate",
        "scheduler",
        "job",
        "image_uri",
    ]
    assert all(line.startswith("longctx sweep: note: ") for line in notes)


def test_points_run_in_the_sweeps_project(tmp_path, monkeypatch):
    """As under `wandb agent`: WANDB_PROJECT / WANDB_ENTITY from the sweep's project / entity."""
    log = tmp_path / "env.jsonl"
    child = (
        "import json, os; open(os.environ['ENV_LOG'], 'a').write(json.dumps("
        "[os.environ.get('WANDB_PROJECT'), os.environ.get('WANDB_ENTITY')]) + '\\n')"
    )
    path = write_sweep(
        tmp_path / "s.yaml",
        {
            "method": "grid",
            "project": "proj",
            "entity": "team",
            "parameters": {"a": {"value": 1}},
            "command": ["${interpreter}", "-c", child],
        },
    )
    monkeypatch.setenv("ENV_LOG", str(log))
    monkeypatch.delenv("WANDB_PROJECT", raising=False)
    assert main(["sweep", str(path), "--summary", str(tmp_path / "summary.jsonl")]) == 0
    assert read_jsonl(log) == [["proj", "team"]]


def test_dry_run_into_a_closed_pipe_ends_quietly(tmp_path):
    """`longctx sweep --dry-run | head -1`: no BrokenPipeError traceback. The output (~200 KB)
    is larger than a pipe's buffer, so the writer is still writing when the reader leaves."""
    path = write_sweep(
        tmp_path / "big.yaml",
        {
            "method": "grid",
            "command": ["${interpreter}", "${args_no_hyphens}"],
            "parameters": {"n": {"distribution": "int_uniform", "min": 1, "max": 5000}},
        },
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "longctx", "sweep", "--dry-run", str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    first = process.stdout.readline()
    process.stdout.close()
    stderr = process.stderr.read().decode()
    assert process.wait(timeout=60) == 128 + signal.SIGPIPE
    assert first.startswith(b"[0] ") and stderr == ""


def test_missing_file(capsys):
    assert main(["sweep", "sweeps/no_such_sweep.yaml"]) == 2
    assert "no_such_sweep.yaml does not exist" in capsys.readouterr().err


# --- CLI dry run --------------------------------------------------------------------------


def test_dry_run_prints_the_numbered_commands(capsys):
    assert main(["sweep", "--dry-run", "sweeps/probe_window_cpu.yaml"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4
    points = plan(load_sweep("sweeps/probe_window_cpu.yaml"))
    for i, (line, point) in enumerate(zip(lines, points, strict=True)):
        number, command = line.split(" ", 1)
        assert number == f"[{i}]" and shlex.split(command) == point.command
    assert main(["sweep", "--dry-run", "--count", "2", "sweeps/probe_window_cpu.yaml"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2
