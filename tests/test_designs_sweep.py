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


def test_the_results_table_reads_each_arm_from_its_run_directory(tmp_path):
    """analysis/designs_sweep.py on two hand-written run directories: the full layers' f(i)
    where linear layers log it (else the all-layer f(i)), the loss tail's mean, the last NIAH
    probe and the wall time summed over a killed and a resumed process; a missing arm is
    listed as not run; the tail loss paired step by step with the first arm's."""
    import json
    import subprocess
    import sys

    def write_run(name, rows, niah=None):
        run = tmp_path / "runs" / name
        run.mkdir(parents=True)
        (run / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
        if niah:
            (run / "niah" / "step-0000004").mkdir(parents=True)
            (run / "niah" / "step-0000004" / "niah.json").write_text(json.dumps(niah))

    losses = [
        {"step": s, "train/loss": loss, "train/tokens_seen": 100.0 * s}
        for s, loss in [(1, 4.0), (2, 3.0), (3, 2.5), (4, 1.5)]
    ]
    fi = {f"fi/f@{d}": 9.0 for d in ("L/4", "L/2", "3L/4", "L-1")}
    full = {"fi/full_f@L/4": 40.0, "fi/full_f@L/2": 20.0, "fi/full_f@3L/4": 10.0, "fi/full_f@L-1": 1.0}
    per_length = [{"length": 256, "rate": 1.0, "recall": 1.0}, {"length": 320, "rate": 0.25, "recall": 0.5}]
    write_run(
        "hybrid",
        [
            *losses,
            {"step": 4, **fi, **full},
            {"step": 4, "niah/effective_length": 256.0},
            {"step": 4, "answers/loss": 0.75, "answers/value_exact": 0.5},
        ],
        {"per_length": per_length},
    )
    plain_losses = [{"step": s, "train/loss": loss} for s, loss in [(1, 4.5), (2, 3.0), (3, 3.5), (4, 1.5)]]
    write_run("plain", [*plain_losses, {"step": 4, **fi}])
    (tmp_path / "times.log").write_text("hybrid wall 10.5 s\n== note\nhybrid wall 2 s\nplain wall 7 s\n")
    out = tmp_path / "out"
    arguments = [str(tmp_path / "runs"), "--arms", "plain", "hybrid", "absent", "--times", str(tmp_path / "times.log")]
    done = subprocess.run(
        [sys.executable, "analysis/designs_sweep.py", *arguments, "--tail", "2", "--out", str(out)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    arms = json.loads((out / "designs_sweep_arms.json").read_text())
    hybrid, plain = arms["hybrid"], arms["plain"]
    assert (hybrid["steps"], hybrid["tokens"], hybrid["loss_last"], hybrid["loss_tail_mean"]) == (4, 400.0, 1.5, 2.0)
    assert hybrid["fi"] == {"L/4": 40.0, "L/2": 20.0, "3L/4": 10.0, "L-1": 1.0} and plain["fi"]["L-1"] == 9.0
    assert (hybrid["answer_loss"], hybrid["answer_exact"], hybrid["niah_effective_length"]) == (0.75, 0.5, 256.0)
    assert hybrid["niah"] == {"step": 4, "lengths": [256, 320], "rate": [1.0, 0.25], "recall": [1.0, 0.5]}
    assert (hybrid["wall_s"], plain["wall_s"], plain["niah"], plain["loss_tail_mean"]) == (12.5, 7.0, None, 2.5)
    # paired with the first arm at steps 3 and 4: 2.5 - 3.5 and 1.5 - 1.5; se = sd / sqrt(2) = 0.5
    paired = hybrid["tail_loss_minus_reference"]
    assert paired["reference"] == "plain" and paired["mean"] == -0.5 and abs(paired["se"] - 0.5) < 1e-12
    table = json.loads((out / "designs_sweep.json").read_text())["rows"]
    assert [row[0] for row in table] == ["plain", "hybrid", "absent"] and table[2][1] == "not run"
    assert table[1][5] == "-0.500 (0.500)" and table[0][5] == "-"
    assert table[1][13] == "256: 1.00 / 1.00, 320: 0.25 / 0.50"
