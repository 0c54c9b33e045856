"""Reading `.wandb` logs that end mid-record or in damaged bytes, made from a real offline run."""

import os
import shutil
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

from longctx.analysis.runs import load_history
from longctx.analysis.wandb_offline import TruncatedLogWarning, log_end, read_history, run_file

ROWS = 40
SPANNING_ROW = 20
"""This row carries 70 KB, so its record spans three 32 KiB blocks (FIRST, MIDDLE, LAST)."""

_WRITE_RUN = textwrap.dedent(f"""
    import sys, wandb
    run = wandb.init(mode="offline", dir=sys.argv[1], project="truncation",
                     settings=wandb.Settings(silent=True, x_disable_stats=True))
    for i in range({ROWS}):
        big = "b" * (70_000 if i == {SPANNING_ROW} else 300)
        run.log({{"train/loss": i / 8, "marker": f"<row-{{i:04d}}>", "big": big, "trainer/global_step": i}})
    run.finish()
""")


@pytest.fixture(scope="module")
def offline_run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("wandb-truncation")
    env = {key: value for key, value in os.environ.items() if not key.startswith("WANDB_")}
    done = subprocess.run(
        [sys.executable, "-c", _WRITE_RUN, str(root)],
        check=False,
        env=dict(env, WANDB_SILENT="true"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (run_dir,) = root.glob("wandb/offline-run-*")
    return run_dir


def _marker(data: bytes, row: int, record: str = "history") -> int:
    """Byte offset of row `row`'s marker value inside its history record, or inside the
    summary record W&B writes just before it (the log holds summary i, history i, ...)."""
    needle = f"<row-{row:04d}>".encode()
    assert data.count(needle) == 2
    return data.rindex(needle) if record == "history" else data.index(needle)


def _inside_spanning_history(data: bytes) -> int:
    """A byte inside the 70 KB value of the spanning row's history record (no other row has
    20 KB of `b`, and the history record comes after the row's summary record)."""
    return data.rindex(b"b" * 20_000) + 10_000


def _write(tmp_path: Path, data: bytes) -> Path:
    path = tmp_path / "run-cut.wandb"
    path.write_bytes(data)
    return path


def _read_quietly(path: Path) -> list[dict]:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return read_history(path)


def test_the_whole_log_reads_cleanly(offline_run):
    path = run_file(offline_run)
    rows = _read_quietly(path)
    assert [row["marker"] for row in rows] == [f"<row-{i:04d}>" for i in range(ROWS)]
    assert len(rows[SPANNING_ROW]["big"]) == 70_000
    assert log_end(path).dropped == 0


@pytest.mark.parametrize(
    "row, where", [(5, "summary"), (5, "history"), (SPANNING_ROW, "spanning"), (ROWS - 1, "history")]
)
def test_a_log_cut_inside_a_row_gives_the_rows_before_it(offline_run, tmp_path, row, where):
    data = run_file(offline_run).read_bytes()
    full = _read_quietly(run_file(offline_run))
    cut = _inside_spanning_history(data) if where == "spanning" else _marker(data, row, where) + 3
    path = _write(tmp_path, data[:cut])
    with pytest.warns(TruncatedLogWarning, match=r"dropped the last \d+") as caught:
        rows = read_history(path)
    assert rows == full[:row]
    end = log_end(path)
    assert 0 < end.dropped < cut and end.size == cut
    assert f"dropped the last {end.dropped} " in str(caught[0].message)
    # the complete part alone reads the same rows without a warning
    assert _read_quietly(_write(tmp_path, data[: end.complete])) == full[:row]


def test_every_cut_near_a_record_start_keeps_the_complete_rows(offline_run, tmp_path):
    data = run_file(offline_run).read_bytes()
    full = _read_quietly(run_file(offline_run))
    start = _marker(data, 6)
    for cut in range(start - 60, start + 8):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", TruncatedLogWarning)
            rows = read_history(_write(tmp_path, data[:cut]))
        assert rows == full[:6], cut


def test_a_damaged_record_ends_the_readable_log(offline_run, tmp_path):
    data = bytearray(run_file(offline_run).read_bytes())
    full = _read_quietly(run_file(offline_run))
    data[_marker(bytes(data), 12) + 2] ^= 0x20  # flip one bit inside row 12's record
    with pytest.warns(TruncatedLogWarning, match="checksum mismatch"):
        rows = read_history(_write(tmp_path, bytes(data)))
    assert rows == full[:12]


def test_garbage_after_the_last_record_is_dropped_and_counted(offline_run, tmp_path):
    data = run_file(offline_run).read_bytes()
    garbage = bytes(range(7, 107))
    path = _write(tmp_path, data + garbage)
    with pytest.warns(TruncatedLogWarning, match=f"dropped the last {len(garbage)} "):
        assert read_history(path) == _read_quietly(run_file(offline_run))
    assert log_end(path).dropped == len(garbage)


def test_load_history_reads_a_run_killed_mid_record(offline_run, tmp_path):
    run_dir = tmp_path / offline_run.name
    shutil.copytree(offline_run, run_dir)
    path = run_file(run_dir)
    data = path.read_bytes()
    path.write_bytes(data[: _marker(data, 30) + 5])
    with pytest.warns(TruncatedLogWarning):
        history = load_history(run_dir)
    losses = history[history["metric"] == "train/loss"]
    assert losses["step"].tolist() == list(
        range(1, 31)
    )  # trainer/global_step i is optimizer step i + 1 (analysis.runs)
    assert losses["value"].tolist() == [i / 8 for i in range(30)]
