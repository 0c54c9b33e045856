"""Checkpoint crash safety: fsync + atomic rename, a writer SIGKILLed mid-save resumes, and
a save that meets a full disk or no permission is a named error that keeps the previous file."""

import errno
import io
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from longctx.cli import main
from longctx.errors import CheckpointSaveError
from longctx.train.checkpoint_io import AtomicCheckpointIO, atomic_save
from tests.train.helpers import overrides


def test_the_file_is_synced_before_the_rename_and_the_directory_after(tmp_path, monkeypatch):
    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(descriptor):
        events.append("fsync directory" if stat.S_ISDIR(os.fstat(descriptor).st_mode) else "fsync file")
        real_fsync(descriptor)

    def replace(source, target):
        events.append(f"replace {Path(source).name} -> {Path(target).name}")
        real_replace(source, target)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    AtomicCheckpointIO().save_checkpoint({"w": torch.arange(5)}, tmp_path / "last.ckpt")
    assert events == ["fsync file", f"replace .last.ckpt.tmp-{os.getpid()} -> last.ckpt", "fsync directory"]
    assert torch.equal(torch.load(tmp_path / "last.ckpt", weights_only=True)["w"], torch.arange(5))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]


class _FailsToPickle:
    def __reduce__(self):
        raise RuntimeError("cannot pickle this")


def test_a_failed_save_keeps_the_previous_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "last.ckpt"
    atomic_save({"step": 1, "w": torch.ones(1000)}, path)
    with pytest.raises(RuntimeError, match="cannot pickle this"):
        atomic_save({"step": 2, "w": torch.zeros(1000), "bad": _FailsToPickle()}, path)
    assert torch.load(path, weights_only=True)["step"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]


def test_stale_temporaries_of_killed_writers_are_removed_by_the_next_save(tmp_path):
    stale = tmp_path / ".last.ckpt.tmp-999999"
    stale.write_bytes(b"half a checkpoint")
    atomic_save({"step": 3}, tmp_path / "last.ckpt")
    assert not stale.exists()


# A `longctx pretrain` process whose save of last.ckpt at step 2 stops after 20 KB of the
# file have been written: the test SIGKILLs it there, as a pre-emption or OOM kill would.
_STALLING_TRAINER = textwrap.dedent("""
    import sys, time
    import torch
    from longctx.cli import main
    from longctx.train.callbacks import training as callbacks

    marker = sys.argv[1]
    stall = False
    real_save, real_save_last = torch.save, callbacks.LastCheckpoint.save

    class StallingFile:
        def __init__(self, file):
            self.file, self.written = file, 0
        def write(self, data):
            count = self.file.write(data)
            self.written += len(data)
            if self.written > 20_000:
                self.file.flush()
                open(marker, "w").close()
                time.sleep(600)
            return count
        def __getattr__(self, name):
            return getattr(self.file, name)

    def save(obj, f, *args, **kwargs):
        return real_save(obj, StallingFile(f) if stall else f, *args, **kwargs)

    def save_last(self, trainer):
        global stall
        stall = trainer.global_step == 2
        real_save_last(self, trainer)

    torch.save, callbacks.LastCheckpoint.save = save, save_last
    sys.exit(main(["pretrain", *sys.argv[2:]]))
""")


def _environment() -> dict:
    env = dict(os.environ, WANDB_SILENT="true", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env.pop("WANDB_API_KEY", None)
    return env


def _losses(out_dir: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    return {row["step"]: row["train/loss"] for row in rows if "train/loss" in row}


@pytest.mark.slow  # three short training processes: ~100 s on 2 busy cores
def test_a_writer_killed_mid_checkpoint_leaves_a_good_last_ckpt_and_resumes(workspace, tmp_path):
    steps = 4
    run = tmp_path / "run"
    args = overrides(
        workspace,
        run,
        **{
            "train.max_steps": steps,
            "train.checkpoint_every_steps": 1,
            "probe.fi": False,
            "log.wandb_mode": "disabled",
        },
    )
    marker = tmp_path / "stalled"
    writer = subprocess.Popen(
        [sys.executable, "-c", _STALLING_TRAINER, str(marker), *args],
        env=_environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 240
        while not marker.exists():
            assert writer.poll() is None, writer.communicate()[0][-3000:]
            assert time.monotonic() < deadline, "the writer never reached the step-2 save"
            time.sleep(0.05)
        os.kill(writer.pid, signal.SIGKILL)
    finally:
        writer.kill()
        writer.communicate()

    checkpoints = run / "checkpoints"
    assert len(list(checkpoints.glob(".last.ckpt.tmp-*"))) == 1  # killed with the new file half-written
    last = torch.load(checkpoints / "last.ckpt", map_location="cpu", weights_only=True)
    assert last["global_step"] == 1  # the previous checkpoint, whole
    for path in checkpoints.glob("*.ckpt"):
        torch.load(path, map_location="cpu", weights_only=True)  # every file under its final name is whole

    resumed = subprocess.run(
        [sys.executable, "-m", "longctx", "pretrain", *args, "train.resume=auto"],
        env=_environment(),
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-3000:]
    final = torch.load(checkpoints / "last.ckpt", map_location="cpu", weights_only=True)
    assert final["global_step"] == steps
    assert not list(checkpoints.glob(".*.tmp-*"))  # the killed writer's temporary is gone

    reference = tmp_path / "reference"
    uninterrupted = subprocess.run(
        [
            sys.executable,
            "-m",
            "longctx",
            "pretrain",
            *overrides(
                workspace, reference, **{"train.max_steps": steps, "probe.fi": False, "log.wandb_mode": "disabled"}
            ),
        ],
        env=_environment(),
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert uninterrupted.returncode == 0, uninterrupted.stderr[-3000:]
    resumed_losses, expected = _losses(run), _losses(reference)
    for step in range(2, steps + 1):  # steps 2.. ran after the resume from step 1
        assert resumed_losses[step] == expected[step], f"step {step}"


class _FullDisk(io.RawIOBase):
    """A writer that takes `room` bytes and then fails as a full disk does."""

    def __init__(self, descriptor: int, room: int):
        self.file, self.room = os.fdopen(descriptor, "wb"), room

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        if len(data) > self.room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= len(data)
        return self.file.write(data)

    def fileno(self) -> int:
        return self.file.fileno()

    def close(self) -> None:
        self.file.close()
        super().close()


def _fill_disk_at_checkpoint_save(monkeypatch, failing_save: int, room: int = 10_000) -> None:
    """os.fdopen of the `failing_save`-th checkpoint temporary (1-based) returns `_FullDisk`."""
    real_fdopen, saves = os.fdopen, []

    def fdopen(descriptor, *args, **kwargs):
        if ".ckpt.tmp-" not in os.readlink(f"/proc/self/fd/{descriptor}"):
            return real_fdopen(descriptor, *args, **kwargs)
        saves.append(descriptor)
        return _FullDisk(descriptor, room) if len(saves) == failing_save else real_fdopen(descriptor, *args, **kwargs)

    monkeypatch.setattr(os, "fdopen", fdopen)


def test_a_full_disk_is_a_named_error_with_the_bytes_and_keeps_the_previous_file(tmp_path, monkeypatch):
    path = tmp_path / "last.ckpt"
    atomic_save({"step": 1, "w": torch.ones(1000)}, path)
    _fill_disk_at_checkpoint_save(monkeypatch, failing_save=1)
    state = {"step": 2, "w": torch.zeros(50_000), "m": torch.zeros(25_000, dtype=torch.float64)}
    with pytest.raises(CheckpointSaveError) as caught:
        atomic_save(state, path)
    error = caught.value
    assert error.path == str(path) and error.needed == 50_000 * 4 + 25_000 * 8
    # the free bytes read at the failure: other processes (a parallel test worker) write to
    # the same disk between that read and this one, so within 64 MiB
    assert abs(error.free - shutil.disk_usage(tmp_path).free) <= 64 * 2**20
    assert f"needs {error.needed:,} bytes and {error.free:,} are free" in str(error)
    assert "no space left on the device" in str(error) and "[Errno 28]" in str(error)
    assert torch.load(path, weights_only=True)["step"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]


def test_no_permission_is_a_named_error(tmp_path, monkeypatch):
    real_open = os.open

    def refuse(path, *args, **kwargs):
        if ".ckpt.tmp-" in str(path):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", refuse)
    with pytest.raises(CheckpointSaveError, match="no permission to write there"):
        atomic_save({"w": torch.ones(10)}, tmp_path / "last.ckpt")


def test_torchs_zip_writer_error_is_named_only_when_the_disk_lacks_the_bytes(tmp_path, monkeypatch):
    """The issue's raw `[enforce fail at inline_container.cc] unexpected pos` RuntimeError."""

    def failing_save(obj, handle):
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 64 vs 0")

    monkeypatch.setattr(torch, "save", failing_save)
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda _: usage._replace(free=100))
    with pytest.raises(CheckpointSaveError, match="needs 4,000 bytes and 100 are free"):
        atomic_save({"w": torch.ones(1000)}, tmp_path / "last.ckpt")
    monkeypatch.setattr(shutil, "disk_usage", lambda _: usage._replace(free=10**12))
    with pytest.raises(RuntimeError, match="unexpected pos"):  # not a space problem: the bug stays visible
        atomic_save({"w": torch.ones(1000)}, tmp_path / "last.ckpt")


def test_a_run_whose_disk_fills_at_a_checkpoint_stops_cleanly_and_keeps_the_last_one(
    workspace, tmp_path, monkeypatch, capsys
):
    # saves: step 3's last.ckpt, step 3's numbered copy, then step 6's last.ckpt: that one fails
    _fill_disk_at_checkpoint_save(monkeypatch, failing_save=3)
    args = overrides(workspace, tmp_path, **{"probe.fi": False, "log.wandb_mode": "disabled"})
    assert main(["pretrain", *args]) == 2
    error = capsys.readouterr().err
    assert "last.ckpt: checkpoint not saved: no space left on the device; it needs" in error
    last = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)
    assert last["global_step"] == 3
    assert not list((tmp_path / "checkpoints").glob(".*.tmp-*"))


def test_a_run_whose_first_checkpoints_cannot_fit_is_refused_before_step_1(workspace, tmp_path, monkeypatch, capsys):
    from longctx.config import load
    from longctx.train.memory_budget import estimate_memory

    args = overrides(workspace, tmp_path, **{"probe.fi": False, "log.wandb_mode": "disabled"})
    config = load([], args)
    usage = shutil.disk_usage(workspace)
    monkeypatch.setattr(shutil, "disk_usage", lambda _: usage._replace(free=100_000))
    assert main(["pretrain", *args]) == 2
    error = capsys.readouterr().err
    # the debug model's fp32 parameters and two AdamW moments, counted from the model itself
    from longctx.model.llama import Llama

    numel = sum(p.numel() for p in Llama(config.model).parameters())
    parameters = len(list(Llama(config.model).parameters()))
    size = 3 * 4 * numel + 4 * parameters
    estimate = estimate_memory(config, 1, "32-true", cuda=False)
    assert estimate.parameters + estimate.optimizer == size
    assert f"{2 * size:,} bytes needed, 100,000 free" in error
    assert not (tmp_path / "metrics.jsonl").exists()
