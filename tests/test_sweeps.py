"""Every W&B sweep in sweeps/ expands to configs the CLI accepts, as W&B would pass them."""

from pathlib import Path

import pytest
import yaml

from longctx.config import load
from tests.helpers import wandb_grid

SWEEPS = sorted(Path("sweeps").glob("*.yaml"))


@pytest.mark.parametrize("path", SWEEPS, ids=[p.stem for p in SWEEPS])
def test_every_grid_point_is_a_valid_config(path):
    sweep = yaml.safe_load(path.read_text())
    command = sweep["command"]
    assert command[:4] == ["${env}", "${interpreter}", "-m", "longctx"] and command[-1] == "${args_no_hyphens}"
    assert command[4] in ("pretrain", "sft", "niah")
    items = command[6:-1] if command[4] == "niah" else command[5:-1]  # niah takes the checkpoint first
    files = [item for item in items if "=" not in item]
    fixed = [item for item in items if "=" in item]  # per-point output dirs, interpolating the point's values
    points = wandb_grid(sweep)
    assert points
    out_dirs = set()
    for args in points:
        config = load(files, fixed + args)
        for arg in args:
            key, value = arg.split("=")
            if key != "inherit":  # a recipe file layered as an override, not a config field
                assert str(attribute(config, key)).lower() == value.lower()
        out_key = "eval.out_dir" if command[4] == "niah" else "train.out_dir"
        out_dirs.add(attribute(config, out_key))
    assert len(out_dirs) == len(points)  # no two points write to the same run directory


def attribute(config, dotted_key: str):
    for part in dotted_key.split("."):
        config = getattr(config, part)
    return config


def test_probe_grid_keeps_tokens_per_step():
    sweep = yaml.safe_load(Path("sweeps/probe_window.yaml").read_text())
    configs = [load(["experiments/pretrain/tinyllama_1b_2k.yaml"], args) for args in wandb_grid(sweep)]
    assert {c.train.global_batch_tokens for c in configs} == {4_194_304}
    assert sorted({c.data.window for c in configs}) == [2048, 4096]


@pytest.mark.parametrize("path", SWEEPS, ids=[p.stem for p in SWEEPS])
def test_runs_land_in_the_project_the_config_names(path):
    """Under `wandb agent` the sweep's `project` wins over log.project: both must agree."""
    sweep = yaml.safe_load(path.read_text())
    command = sweep["command"]
    items = command[6:-1] if command[4] == "niah" else command[5:-1]
    config = load(
        [item for item in items if "=" not in item], [item for item in items if "=" in item] + wandb_grid(sweep)[0]
    )
    assert sweep["project"] == config.log.project


@pytest.mark.parametrize("path", SWEEPS, ids=[p.stem for p in SWEEPS])
def test_every_point_has_its_own_run_name_and_wandb_directory(path):
    sweep = yaml.safe_load(path.read_text())
    command = sweep["command"]
    niah = command[4] == "niah"
    items = command[6:-1] if niah else command[5:-1]
    files = [item for item in items if "=" not in item]
    fixed = [item for item in items if "=" in item]
    configs = [load(files, fixed + args) for args in wandb_grid(sweep)]
    # `longctx niah` writes its W&B run under its output directory, training under train.out_dir
    directories = {c.eval.out_dir if niah else c.train.out_dir for c in configs}
    assert len({c.log.run_name for c in configs}) == len(configs) == len(directories)


def test_context_extension_grid_compares_the_recipes_at_equal_tokens():
    sweep = yaml.safe_load(Path("sweeps/context_extension.yaml").read_text())
    configs = [load(["experiments/longrecipe/extend.yaml"], args) for args in wandb_grid(sweep)]
    assert [(c.data.position_transform, c.data.window) for c in configs] == [
        ("none", 2048),
        ("pose", 512),
        ("randpos", 512),
        ("longrecipe", 512),
    ]
    assert {c.train.global_batch_tokens * c.train.max_steps for c in configs} == {8192 * 40}
    assert {c.data.target_length for c in configs} == {2048} == {c.model.max_position for c in configs}
    assert all(c.probe.fi and c.probe.niah_every_steps for c in configs)
