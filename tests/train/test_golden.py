"""Golden loss curve: the first steps of `make demo` must reproduce the committed losses.

A change that silently alters the training numerics (initialisation, RoPE, attention,
packing, the loss normalisation, the optimizer, the data order) moves these numbers; a
refactor that keeps them is numerically neutral. The first GOLDEN_STEPS steps lie inside
the demo's linear warm-up (10 steps), so they do not depend on `train.max_steps`.

After an intended change, regenerate and commit the file with the reason in the message:

    .venv/bin/python -m tests.train.test_golden --update
"""

import json
import sys
from pathlib import Path

import pytest

from longctx.cli import main

GOLDEN_FILE = Path(__file__).parents[1] / "golden" / "demo_losses.json"
DEMO_CONFIG = "experiments/pretrain/tiny_512.yaml"
GOLDEN_STEPS = 6
TOLERANCE = 1e-3
"""Absolute, in nats. Thread counts change the order of float32 reductions (~1e-6 per
step); an actual change of numerics moves the first losses by far more."""


def demo_losses(out_dir: Path) -> list[float]:
    args = [
        DEMO_CONFIG,
        f"train.max_steps={GOLDEN_STEPS}",
        "log.every_steps=1",
        "probe.fi=false",
        "log.wandb_mode=disabled",
        f"train.out_dir={out_dir}",
        f"train.checkpoint_every_steps={GOLDEN_STEPS}",
    ]
    assert main(["pretrain", *args]) == 0
    rows = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    return [row["train/loss"] for row in rows if "train/loss" in row]


def test_demo_reproduces_the_golden_losses(tmp_path):
    golden = json.loads(GOLDEN_FILE.read_text())
    losses = demo_losses(tmp_path / "demo")
    assert len(losses) == GOLDEN_STEPS == len(golden["losses"])
    assert losses == pytest.approx(golden["losses"], abs=TOLERANCE), (
        f"the demo's first losses moved: {losses} vs {golden['losses']}; if intended, "
        "regenerate with `python -m tests.train.test_golden --update`"
    )


if __name__ == "__main__" and sys.argv[1:] == ["--update"]:
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        values = demo_losses(Path(scratch) / "demo")
    GOLDEN_FILE.write_text(
        json.dumps({"config": DEMO_CONFIG, "steps": GOLDEN_STEPS, "losses": values}, indent=1) + "\n"
    )
    print(f"wrote {GOLDEN_FILE}: {values}")
