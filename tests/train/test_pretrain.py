"""End-to-end pretraining through the CLI: FSDP2 and 2-node runs reproduce 1-process
loss curves, SIGTERM + resume reproduces the uninterrupted run exactly, W&B offline
holds the metrics, and bad inputs fail clearly."""

import itertools
import json
import signal
import socket
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from longctx.analysis.wandb_offline import offline_runs, read_history
from longctx.cli import main
from longctx.data.packing import PackedRows, PackedSource
from longctx.data.tokenizer import load_tokenizer
from longctx.probes.position_frequency import PositionFrequency
from tests.train.helpers import STEPS, finish, launch, losses, overrides


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def reference(workspace):
    """The uninterrupted single-process run every other run is compared with."""
    out = workspace / "reference"
    finish(launch(overrides(workspace, out)))
    return out


def final_fi(out_dir: Path) -> dict:
    return dict(np.load(out_dir / "fi" / f"fi-step-{STEPS:07d}.npz"))


def expected_fi(workspace: Path, packing: str = "stream") -> PositionFrequency:
    """f(i) recounted from the rows the run consumed: STEPS x 8 global rows, in order."""
    source = PackedSource(workspace / "data", seed=1234)
    eos_id = load_tokenizer(str(workspace / "tokenizer.json")).eos_id
    rows = PackedRows([source], [1.0], window=64, eos_id=eos_id, doc_mask=True, packing=packing)
    counts = PositionFrequency(64, max_position=64)
    for row in itertools.islice(rows, STEPS * 8):
        counts.update({key: value[None] for key, value in row.items()})
    return counts


def test_single_process_run_learns_and_logs_to_wandb_offline(reference):
    curve = losses(reference)
    assert sorted(curve) == list(range(1, STEPS + 1))
    assert curve[STEPS] < curve[1] - 0.3
    history = [row for row in read_history(offline_runs(reference)[0]) if "train/loss" in row]
    assert [row["train/loss"] for row in history] == pytest.approx([curve[s] for s in sorted(curve)], rel=1e-6)
    assert all(row["train/tokens_seen"] > 0 and row["perf/tokens_per_s"] > 0 for row in history)
    assert (reference / "checkpoints" / "last.ckpt").exists()
    assert sorted(p.name for p in (reference / "checkpoints").iterdir()) == [
        "last.ckpt",
        "step-0000003.ckpt",
        "step-0000006.ckpt",
    ]
    assert torch.load(reference / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == STEPS
    fi_rows = [row for row in read_history(offline_runs(reference)[0]) if "fi/f@L/4" in row]
    # measured after optimizer steps 2, 4, 6: on Lightning's step axis (step k's metrics at k - 1)
    assert [row["trainer/global_step"] for row in fi_rows] == [1, 3, 5]
    tokens = {row["trainer/global_step"]: row["train/tokens_seen"] for row in history}
    assert [tokens[row["trainer/global_step"]] for row in fi_rows] == [row["fi/tokens_seen"] for row in fi_rows]
    assert fi_rows[-1]["fi/tokens_seen"] == STEPS * 512
    # the run directory is self-contained: metrics.jsonl holds the same f(i) scalars
    lines = [json.loads(line) for line in (reference / "metrics.jsonl").read_text().splitlines()]
    file_rows = [row for row in lines if "fi/f@L/4" in row]
    assert [row["step"] for row in file_rows] == [2, 4, 6]
    for logged, written in zip(fi_rows, file_rows, strict=True):
        assert {key: value for key, value in written.items() if key != "step"} == {
            key: value for key, value in logged.items() if key.startswith("fi/") and key in written
        }
        assert set(written) - {"step"} == {key for key in logged if key.startswith("fi/") and "curve" not in key}
    tables = [row for row in read_history(offline_runs(reference)[0]) if "fi/curve_table.path" in row]
    assert len(tables) == 3 and tables[-1]["fi/curve_table._type"] == "table-file"


def test_wandb_fi_table_holds_the_final_counts(workspace, reference):
    run = offline_runs(reference)[0]
    last = [row for row in read_history(run) if "fi/curve_table.path" in row][-1]
    table = json.loads((run / "files" / last["fi/curve_table.path"]).read_text())
    assert table["columns"] == ["relative_position", "f"]
    assert [f for _, f in table["data"]] == expected_fi(workspace).relative.tolist()


def test_fi_totals_equal_a_recount_of_the_consumed_rows(workspace, reference):
    expected = expected_fi(workspace)
    saved = final_fi(reference)
    assert np.array_equal(saved["relative"], expected.relative.numpy())
    assert np.array_equal(saved["absolute"], expected.absolute.numpy())
    assert int(saved["tokens_seen"]) == STEPS * 512


def test_documents_packing_trains_whole_documents_and_counts_no_padding(workspace, tmp_path):
    out = tmp_path / "documents"
    finish(launch(overrides(workspace, out, **{"data.packing": "documents"})))
    expected = expected_fi(workspace, packing="documents")
    saved = final_fi(out)
    assert np.array_equal(saved["relative"], expected.relative.numpy())
    # padding carries no label, so fewer queries are counted than in the stream run
    assert expected.relative[0] < expected_fi(workspace).relative[0]


def test_fsdp_on_two_processes_matches_one(workspace, reference, tmp_path):
    finish(launch(overrides(workspace, tmp_path, **{"train.strategy": "fsdp"}), nproc=2))
    two = losses(tmp_path)
    one = losses(reference)
    assert sorted(two) == sorted(one)
    for step in one:
        assert two[step] == pytest.approx(one[step], rel=1e-5, abs=1e-5)
    for key, value in final_fi(reference).items():  # f(i) all-reduced over ranks = one process
        assert np.array_equal(final_fi(tmp_path)[key], value), key


def test_loader_workers_reproduce_the_in_process_run(workspace, reference, tmp_path):
    """train.loader_workers=2 builds the rows in worker processes: same losses and f(i)."""
    finish(launch(overrides(workspace, tmp_path, **{"train.loader_workers": 2})))
    assert losses(tmp_path) == losses(reference)
    for key, value in final_fi(reference).items():
        assert np.array_equal(final_fi(tmp_path)[key], value), key


def test_two_nodes_on_loopback_match_one(workspace, reference, tmp_path):
    port = free_port()
    nodes = [
        launch(
            overrides(workspace, tmp_path),
            nproc=1,
            extra_torchrun=[
                "--nnodes=2",
                f"--node-rank={rank}",
                "--rdzv-backend=c10d",
                f"--rdzv-endpoint=127.0.0.1:{port}",
                "--rdzv-id=longctx-test",
            ],
        )
        for rank in range(2)
    ]
    for node in nodes:
        finish(node)
    two = losses(tmp_path)
    for step, loss in losses(reference).items():
        assert two[step] == pytest.approx(loss, rel=1e-5, abs=1e-5)


def test_sigterm_checkpoint_then_resume_reproduces_the_run(workspace, reference, tmp_path):
    args = overrides(workspace, tmp_path, **{"train.checkpoint_every_steps": 100})
    process = launch(args)
    metrics = tmp_path / "metrics.jsonl"
    deadline = time.monotonic() + 240
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 2):
        assert process.poll() is None, process.communicate()[0][-3000:]
        assert time.monotonic() < deadline
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    finish(process)
    saved = torch.load(tmp_path / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    stopped_at = saved["global_step"]
    assert 2 <= stopped_at < STEPS

    finish(launch([*args, "train.resume=auto"]))
    resumed, expected = losses(tmp_path), losses(reference)
    assert sorted(resumed) == list(range(1, STEPS + 1))
    for step in range(stopped_at + 1, STEPS + 1):
        assert resumed[step] == expected[step], f"step {step}"
    for key, value in final_fi(reference).items():  # no loss, no double counting
        assert np.array_equal(final_fi(tmp_path)[key], value), key


def test_truncated_checkpoint_is_a_clear_error(workspace, reference, tmp_path, capsys):
    data = (reference / "checkpoints" / "last.ckpt").read_bytes()
    broken = tmp_path / "broken.ckpt"
    broken.write_bytes(data[: len(data) // 2])
    assert main(["pretrain", *overrides(workspace, tmp_path / "run"), f"train.resume={broken}"]) == 2
    assert "broken.ckpt is truncated or corrupt" in capsys.readouterr().err


def test_missing_data_directory_is_a_clear_error(workspace, tmp_path, capsys):
    args = overrides(workspace, tmp_path, **{"data.path": tmp_path / "nowhere"})
    assert main(["pretrain", *args]) == 2
    assert "nowhere does not exist; run `longctx prepare" in capsys.readouterr().err


def test_run_prints_its_memory_estimate_and_refuses_one_that_cannot_fit(workspace, tmp_path, capsys):
    """train.memory_limit_gib (the device's total on CUDA) is checked before step 1."""
    args = overrides(workspace, tmp_path, **{"train.memory_limit_gib": 0.001, "log.wandb_mode": "disabled"})
    assert main(["pretrain", *args]) == 2
    captured = capsys.readouterr()
    assert "memory estimate per device" in captured.out and "activations" in captured.out
    assert "train.micro_batch_size" in captured.err and "train.activation_checkpointing" in captured.err
    assert not (tmp_path / "checkpoints" / "last.ckpt").exists()


def test_torchrun_world_size_mismatch_is_a_clear_error(workspace, tmp_path, monkeypatch):
    from longctx.config import load
    from longctx.train.trainer import world_size_from_environment

    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    config = load([], ["train.devices=8"])
    with pytest.raises(ValueError, match="train.devices: 8 but torchrun launched 2"):
        world_size_from_environment(config)
    assert world_size_from_environment(load([], [])).num_nodes == 2


def test_init_continues_from_a_checkpoint_at_a_longer_window(workspace, reference, tmp_path, capsys):
    """init=CKPT starts from its weights (context extension: max_position and the window
    double, RoPE base changes, shapes stay): the first step's loss is the trained model's,
    far below a fresh model's; a checkpoint of another architecture is a clear error."""
    trained = reference / "checkpoints" / "last.ckpt"
    extended = {
        "model.max_position": 128,
        "data.window": 128,
        "model.rope_base": 40000.0,
        "train.global_batch_tokens": 1024,
        "train.max_steps": 1,
        "probe.fi": False,
    }
    fresh, continued = tmp_path / "fresh", tmp_path / "continued"
    assert main(["pretrain", *overrides(workspace, fresh, **extended)]) == 0
    assert main(["pretrain", *overrides(workspace, continued, **extended), f"init={trained}"]) == 0
    assert losses(continued)[1] < losses(fresh)[1] - 0.3  # the reference run learnt > 0.3 nats in 6 steps
    wider = overrides(workspace, tmp_path / "wider", **{**extended, "model.d_ff": 512})
    assert main(["pretrain", *wider, f"init={trained}"]) == 2
    assert "init: " in (error := capsys.readouterr().err) and "d_ff: 256 vs 512" in error


def test_resume_may_change_schedule_length_cadences_and_world_size(workspace, reference, tmp_path):
    """The keys train/resume_check.py lets change: the reference run's last checkpoint
    (1 process, 6 steps) continues on 2 processes to 8 steps with other logging, probe and
    checkpoint cadences, from its trained weights."""
    args = overrides(
        workspace,
        tmp_path,
        **{
            "train.max_steps": 8,
            "train.checkpoint_every_steps": 4,
            "log.every_steps": 2,
            "probe.fi_every_steps": 1,
            "log.wandb_mode": "disabled",
            "train.resume": reference / "checkpoints" / "last.ckpt",
        },
    )
    finish(launch(args, nproc=2))
    resumed = losses(tmp_path)
    assert sorted(resumed) == [7, 8]
    assert resumed[7] < losses(reference)[1] - 0.3  # continues the trained model, not a fresh one
    assert torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 8


def test_stop_at_step_ends_the_run_early_on_the_full_run_s_schedule(workspace, reference, tmp_path):
    """train.stop_at_step=5 of a 6-step run (the GPU twin's tuning job reads step 300 of a
    1,200-step recipe): its losses are the full run's first 5, and it saves at step 5. A
    5-step run decays its learning rate sooner (its 4th update already), so its step-5
    loss differs."""
    stopped, short = tmp_path / "stopped", tmp_path / "short"
    finish(launch(overrides(workspace, stopped, **{"train.stop_at_step": 5})))
    finish(launch(overrides(workspace, short, **{"train.max_steps": 5})))
    full = losses(reference)
    assert losses(stopped) == pytest.approx({step: full[step] for step in range(1, 6)}, rel=1e-6)
    assert torch.load(stopped / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 5
    assert losses(short)[5] != pytest.approx(full[5], rel=1e-6)


HYBRID = {
    "model.n_layers": 4,
    "model.global_every": 2,
    "model.sliding_window": 16,
    "model.sliding_rope_base": 1000.0,
    "model.nope_layers": "[1]",
}
"""Layers: sliding, full NoPE, sliding, full; window 16 of the 64-token rows."""


def test_a_hybrid_model_pretrains_resumes_and_logs_what_its_sliding_layers_train(workspace, tmp_path):
    full, parts = tmp_path / "full", tmp_path / "parts"
    finish(launch(overrides(workspace, full, **HYBRID)))
    finish(launch(overrides(workspace, parts, **HYBRID, **{"train.stop_at_step": 3})))
    finish(launch([*overrides(workspace, parts, **HYBRID), "train.resume=auto"]))
    curve = losses(full)
    assert curve[STEPS] < curve[1] - 0.3
    assert losses(parts) == curve  # resumed from step 3, exactly
    counts = final_fi(full)
    assert counts["sliding"][:16].sum() > 0 and counts["sliding"][16:].sum() == 0
    assert np.array_equal(counts["sliding"][:16], counts["relative"][:16])  # consecutive ids
    history = read_history(offline_runs(full)[0])
    assert any("fi/curve_sliding_table.path" in row for row in history)
    assert any(row.get("fi/sliding_f@W-1", 0) > 0 for row in history)


def test_drope_drops_rope_from_a_trained_checkpoint_and_recalibrates(workspace, reference, tmp_path):
    """experiments/longrecipe/drope.yaml's recipe at test size: init=CKPT with every layer
    NoPE. The weights load (rotation has none): the first loss is far below a fresh
    model's (the weights carry what it learnt) and not the RoPE model's on the same batch
    (its positions are gone); recalibration at the original length lowers it."""
    trained = reference / "checkpoints" / "last.ckpt"
    drope = {"model.nope_every": 1, "train.max_steps": 4, "train.warmup_steps": 1, "probe.fi": False}
    out = tmp_path / "drope"
    assert main(["pretrain", *overrides(workspace, out, **drope), f"init={trained}"]) == 0
    fresh, rope = tmp_path / "fresh", tmp_path / "rope"
    one_step = {**drope, "train.max_steps": 1}
    assert main(["pretrain", *overrides(workspace, fresh, **one_step)]) == 0
    assert (
        main(["pretrain", *overrides(workspace, rope, **{**one_step, "model.nope_every": 0}), f"init={trained}"]) == 0
    )
    recalibrated = losses(out)
    assert recalibrated[1] < losses(fresh)[1] - 0.3
    assert recalibrated[1] != pytest.approx(
        losses(rope)[1], abs=1e-6
    )  # ~1e-5 apart: a 6-step model barely uses positions
    assert recalibrated[4] < recalibrated[1]
