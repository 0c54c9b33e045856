"""The committed replication configs keep the commitments the verdict rules rest on."""

from pathlib import Path

import pytest
import yaml

from longctx import config as config_module
from longctx_replication.seed_verdicts import MIN_SEEDS

REPOSITORY = Path(__file__).resolve().parents[2]
TUNING_SEEDS = {0, 1, 100, 101, 102}
"""Seeds the recipe was or may be tuned on (docs/replication.md); never verdict seeds."""
SCALES = {"replicate_cpu": 3, "replicate_full": 5, "replicate_gpu": 3, "replicate_smoke": 3}
"""Verdict seeds each chain (sweeps/<name>*.yaml) must run at least."""


def _seeds(path: Path) -> list[int]:
    parameters = yaml.safe_load(path.read_text())["parameters"]
    spec = parameters.get("train.seed")
    assert spec is not None, f"{path.name}: train.seed is not a grid dimension"
    return list(spec.get("values", [spec.get("value")]))


@pytest.mark.parametrize("chain", sorted(SCALES))
def test_every_sweep_of_a_chain_runs_the_same_verdict_seeds(chain):
    paths = sorted((REPOSITORY / "sweeps").glob(f"{chain}*.yaml"))
    assert len(paths) == 4, [p.name for p in paths]  # pretraining, Table 1, SFT and its plain arm
    seeds = {p.name: _seeds(p) for p in paths}
    first = seeds[f"{chain}.yaml"]
    assert all(s == first for s in seeds.values()), seeds
    assert len(set(first)) >= max(SCALES[chain], MIN_SEEDS)
    assert not set(first) & TUNING_SEEDS


def test_tuning_sweep_uses_only_tuning_seeds():
    assert set(_seeds(REPOSITORY / "sweeps" / "replicate_tuning.yaml")) <= TUNING_SEEDS


@pytest.mark.parametrize("base", ["cpu_base.yaml", "gpu_base.yaml"], ids=["cpu_base", "twin_base"])
def test_one_stream_and_probes_every_tenth_of_training(base):
    config = config_module.load([REPOSITORY / "experiments" / "replicate" / base])
    steps = config.train.max_steps
    assert config.data.packing == "stream" and config.data.mask_cut_answers
    for every in (config.probe.niah_every_steps, config.probe.fi_every_steps, config.probe.answer_every_steps):
        assert 0 < every <= steps / 10
    assert config.probe.niah_tests_per_length >= 50
