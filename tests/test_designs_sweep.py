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
    assert len(configs) == 9
    for config in configs:
        assert config.data.window == 512 and config.probe.niah_every_steps > 0 and config.probe.fi
        assert config.train.resume == "auto"  # a killed arm continues when the sweep runs again
        assert (config.data.seed, config.train.seed, config.train.global_batch_tokens) == (0, 10, 4608)
        assert config.data == configs[0].data and config.probe == configs[0].probe
        train = dataclasses.replace(config.train, out_dir=configs[0].train.out_dir)
        assert train == configs[0].train
    designs = [config.model.layer_specs() for config in configs]
    assert len({str(d) for d in designs} | {str(c.model.rotary_fraction) for c in configs}) >= 4
    kinds = {spec.kind for spec in designs[2]}
    assert kinds == {"sliding", "full"} and any(not spec.rope for spec in designs[1])


def test_the_hybrid_arms_are_three_to_one_with_their_full_layers_as_released():
    """OLMo Hybrid with RoPE and with NoPE full layers (as released), Qwen3-Next with partial
    RoPE 0.25 and gated full layers: three linear layers to one full, two full layers."""
    by_name = {point[0].split("/")[-1]: load(BASE, point) for point in POINTS}
    for name in ("hybrid_olmo_rope.yaml", "hybrid_olmo_nope.yaml", "hybrid_qwen3next.yaml"):
        model = by_name[name].model
        assert model.layer_kinds() == ["linear", "linear", "linear", "full"] * 2, name
    olmo_rope, olmo_nope, qwen = (by_name[f"hybrid_{n}.yaml"].model for n in ("olmo_rope", "olmo_nope", "qwen3next"))
    assert [s.rope for s in olmo_rope.layer_specs() if s.kind == "full"] == [True, True]
    assert not any(s.rope for s in olmo_nope.layer_specs())  # no layer has positions
    assert olmo_rope.linear_attention == olmo_nope.linear_attention
    assert olmo_rope.linear_attention.variant == "olmo_hybrid" and qwen.linear_attention.variant == "qwen3_next"
    assert (qwen.rotary_fraction, qwen.partial_rotary, qwen.attention_gate) == (0.25, "first", "elementwise")
    assert olmo_rope.attention_gate == "none" and olmo_rope.rotary_fraction == 1.0


@pytest.mark.parametrize("point", POINTS, ids=[p[0].split("/")[-1] for p in POINTS])
def test_every_design_trains_a_step_at_its_window(point):
    config = load(BASE, point)
    torch.manual_seed(0)
    model = Llama(config.model)
    ids = torch.randint(0, config.model.vocab_size, (1, config.data.window + 1))
    loss = model(ids[:, :-1], labels=ids[:, 1:], attention_backend="varlen")
    loss.backward()
    assert torch.isfinite(loss) and all(p.grad is not None for p in model.parameters() if p.requires_grad)
