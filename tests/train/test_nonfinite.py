"""Non-finite training is stopped, not saved (train/nonfinite.py, issue 37 item 1).

Divergence is injected as a NaN gradient in one chosen optimizer step (helpers.PoisonGradient)
or produced for real by a learning rate of 1e4; the checks read the checkpoints back."""

import json
import math
import signal

import pytest
import torch

from longctx.cli import main
from longctx.errors import NonFiniteError
from longctx.train.nonfinite import NonFiniteGuard
from tests.train.helpers import losses, overrides, poison


def saved(path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


def all_finite(checkpoint: dict) -> bool:
    tensors = list(checkpoint["state_dict"].values())
    for state in checkpoint.get("optimizer_states", []):
        tensors += [t for entry in state["state"].values() for t in entry.values()]
    return all(bool(torch.isfinite(t).all()) for t in tensors if t.is_floating_point())


@pytest.fixture(autouse=True)
def keep_sigterm_handler():
    """The in-process runs install LastCheckpoint's SIGTERM handler: restore pytest's."""
    handler = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, handler)


def test_a_non_finite_step_stops_the_run_naming_it_and_keeps_the_finite_checkpoints(workspace, tmp_path, capsys):
    args = overrides(
        workspace,
        tmp_path,
        **{
            "train.checkpoint_every_steps": 2,
            "train.callbacks": poison(3),
            "log.every_steps": 100,
            "probe.fi": False,
            "log.wandb_mode": "disabled",
        },
    )
    assert main(["pretrain", *args]) == 2
    error = capsys.readouterr().err
    assert "train/grad_norm = nan at optimizer step 3" in error and "train.on_nonfinite=stop" in error
    checkpoints = tmp_path / "checkpoints"
    # step 4's numbered copy and last.ckpt would be written after the divergence: neither is
    assert sorted(p.name for p in checkpoints.iterdir()) == ["last.ckpt", "step-0000002.ckpt"]
    last = saved(checkpoints / "last.ckpt")
    assert last["global_step"] == 2 and all_finite(last)


def test_a_real_divergence_stops_before_any_non_finite_checkpoint(workspace, tmp_path, capsys):
    """The issue's reproduction: train.lr=1e4 (no warm-up) makes the loss NaN within a few steps."""
    args = overrides(
        workspace,
        tmp_path,
        **{
            "train.lr": 1e4,
            "train.min_lr": 1e4,
            "train.warmup_steps": 0,
            "train.max_steps": 12,
            "probe.fi": False,
            "log.wandb_mode": "disabled",
        },
    )
    assert main(["pretrain", *args]) == 2
    error = capsys.readouterr().err
    assert "training diverged" in error
    for path in (tmp_path / "checkpoints").glob("*.ckpt"):
        assert all_finite(saved(path)), path


def test_the_sigterm_save_after_a_non_finite_step_is_refused(workspace, tmp_path, capsys):
    args = overrides(
        workspace,
        tmp_path,
        **{
            "train.checkpoint_every_steps": 100,
            "log.every_steps": 100,
            "train.callbacks": poison(2, sigterm=True),
            "probe.fi": False,
            "log.wandb_mode": "disabled",
        },
    )
    assert main(["pretrain", *args]) == 2
    assert "at optimizer step 2" in capsys.readouterr().err
    assert not (tmp_path / "checkpoints" / "last.ckpt").exists()


def test_skip_drops_exactly_that_update_counts_it_and_trains_on(workspace, tmp_path):
    args = overrides(
        workspace,
        tmp_path,
        **{
            "train.on_nonfinite": "skip",
            "train.checkpoint_every_steps": 1,
            "train.max_steps": 4,
            "train.callbacks": poison(3),
            "probe.fi": False,
            "log.wandb_mode": "disabled",
        },
    )
    assert main(["pretrain", *args]) == 0
    checkpoints = tmp_path / "checkpoints"
    before, skipped, after = (saved(checkpoints / f"step-{s:07d}.ckpt") for s in (2, 3, 4))
    for name, tensor in before["state_dict"].items():  # step 3 changed no weight ...
        assert torch.equal(skipped["state_dict"][name], tensor), name
    for index, state in before["optimizer_states"][0]["state"].items():  # ... no moment, no step count
        for key, value in state.items():
            assert torch.equal(skipped["optimizer_states"][0]["state"][index][key], value), (index, key)
    assert any(not torch.equal(after["state_dict"][n], t) for n, t in before["state_dict"].items())
    assert all_finite(after) and after["nonfinite"] == {"skipped": 1}
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [row["train/skipped_steps"] for row in rows if "train/skipped_steps" in row] == [0, 0, 1, 1]
    assert all(math.isfinite(loss) for loss in losses(tmp_path).values())


def test_skip_stops_after_max_skipped_steps(workspace, tmp_path, capsys):
    args = overrides(
        workspace,
        tmp_path,
        **{
            "train.on_nonfinite": "skip",
            "train.max_skipped_steps": 0,
            "train.callbacks": poison(2),
            "train.max_steps": 3,
            "probe.fi": False,
            "log.wandb_mode": "disabled",
        },
    )
    assert main(["pretrain", *args]) == 2
    assert "1 optimizer updates dropped as non-finite, more than train.max_skipped_steps=0" in capsys.readouterr().err


def test_a_non_finite_loss_is_named_and_its_update_dropped_on_the_device():
    """The loss backward receives (whatever weighting produced it) is checked, not only
    the gradient norm; the fused optimizer leaves parameters and state untouched."""
    parameter = torch.nn.Parameter(torch.ones(3))
    optimizer = torch.optim.AdamW([parameter], lr=0.1, fused=True)
    guard = NonFiniteGuard("stop", max_skipped_steps=0)
    parameter.grad = torch.ones(3)
    guard.observe_loss(torch.tensor(2.0))
    guard.before_update(optimizer, torch.tensor(1.0), step=1)
    optimizer.step()
    assert guard.check() == 0
    moved = parameter.detach().clone()
    guard.observe_loss(torch.tensor(1.0))
    guard.observe_loss(torch.tensor(float("inf")))  # second micro-batch of step 2
    guard.before_update(optimizer, torch.tensor(1.0), step=2)
    optimizer.step()
    assert torch.equal(parameter.detach(), moved) and int(optimizer.state[parameter]["step"]) == 1
    with pytest.raises(NonFiniteError, match=r"train/loss = inf at optimizer step 2") as caught:
        guard.check()
    assert (caught.value.step, caught.value.quantity, caught.value.value) == (2, "train/loss", math.inf)


def test_an_unfused_optimizer_is_refused_by_name():
    """Only a fused optimizer reads found_inf; an unfused one would apply the update anyway."""
    weight = torch.nn.Parameter(torch.ones(2))
    optimizer = torch.optim.AdamW([weight], lr=1e-3)
    with pytest.raises(TypeError, match="AdamW was built without fused=True"):
        NonFiniteGuard("stop", max_skipped_steps=0).before_update(optimizer, torch.tensor(1.0), 1)
