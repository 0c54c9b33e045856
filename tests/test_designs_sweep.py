"""The designs sweep (sweeps/designs_cpu.yaml): every point is the same miniature run at
window 512 on the same tokens with its NIAH probe on, and only the design differs; each
point's model builds from its resolved config and trains a step at its window (the smoke;
running the sweep to a result is a 2-core afternoon, docs/design.md §5)."""

import dataclasses
from pathlib import Path

import pytest
import torch
import yaml

from longctx.config import load
from longctx.model.llama import Llama
from tests.helpers import wandb_grid

SWEEP = yaml.safe_load(Path("sweeps/designs_cpu.yaml").read_text())
POINTS = wandb_grid(SWEEP)
BASE = ["experiments/designs/base.yaml"]


def test_the_points_differ_only_in_their_design():
    configs = [load(BASE, point) for point in POINTS]
    assert len(configs) == 6
    for config in configs:
        assert config.data.window == 512 and config.probe.niah_every_steps > 0 and config.probe.fi
        assert (config.data.seed, config.train.seed, config.train.global_batch_tokens) == (0, 10, 4608)
        assert config.data == configs[0].data and config.probe == configs[0].probe
        train = dataclasses.replace(config.train, out_dir=configs[0].train.out_dir)
        assert train == configs[0].train
    designs = [config.model.layer_specs() for config in configs]
    assert len({str(d) for d in designs} | {str(c.model.rotary_fraction) for c in configs}) >= 4
    kinds = {spec.kind for spec in designs[2]}
    assert kinds == {"sliding", "full"} and any(not spec.rope for spec in designs[1])


@pytest.mark.parametrize("point", POINTS, ids=[p[0].split("/")[-1] for p in POINTS])
def test_every_design_trains_a_step_at_its_window(point):
    config = load(BASE, point)
    torch.manual_seed(0)
    model = Llama(config.model)
    ids = torch.randint(0, config.model.vocab_size, (1, config.data.window + 1))
    loss = model(ids[:, :-1], labels=ids[:, 1:], attention_backend="varlen")
    loss.backward()
    assert torch.isfinite(loss) and all(p.grad is not None for p in model.parameters() if p.requires_grad)
