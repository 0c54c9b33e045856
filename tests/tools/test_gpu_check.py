"""`make gpu-check` (tools/gpu/gpu_check.py): its CPU smoke runs every part end to end,
so that a GPU session loses no minute to a typo or an import error; its limits hold: a
part past its budget is stopped and reported, the next part still runs, and a failed
correctness check makes the exit status non-zero; and every correctness check
(tools/gpu/gpu_check_correctness.py) runs its flash path on CPU at tiny sizes through
the CPU stand-in of torch's varlen kernel, installed here (the script itself imports no test
code, so its own smoke runs on the pure-torch `varlen` backend)."""

import functools
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers import gpu_image_environment
from tests.model import varlen_stand_in

REPOSITORY = Path(__file__).resolve().parents[2]
DEVICE_SCRIPTS = REPOSITORY / "tools" / "gpu"
SAVED_PATH = list(sys.path)
sys.path.insert(0, str(DEVICE_SCRIPTS))
import gpu_check  # noqa: E402  (a script directory, not a package)
import gpu_check_correctness  # noqa: E402

sys.path[:] = SAVED_PATH  # the scripts put benchmarks/ on it too

CPU = torch.device("cpu")
IN_PROCESS = [name for name in gpu_check_correctness.checks(True, CPU, Path("unused")) if name != "kill + resume"]
"""Every correctness check but the kill + resume, whose pretrains run in processes of their
own (no stand-in reaches them; on CPU they train on varlen either way): the smoke below runs it."""


@pytest.mark.parametrize("name", IN_PROCESS)
def test_every_correctness_check_passes_on_the_flash_path_at_tiny_sizes(name, tmp_path, monkeypatch):
    varlen_stand_in.install(monkeypatch, "torch-2.14")
    check = gpu_check_correctness.checks(True, CPU, tmp_path, backend="flash")[name]
    assert check()


def test_the_in_process_checks_and_the_smoke_cover_every_check():
    names = list(gpu_check_correctness.checks(True, CPU, Path("unused")))
    assert len(names) == 19 and [name for name in names if name not in IN_PROCESS] == ["kill + resume"]
    # The slowest check runs last, so a part stopped at its limit keeps every other one.
    assert names[-1] == "kill + resume"


def test_a_correctness_check_can_fail(tmp_path, monkeypatch):
    """A band method whose flash path is wrong (the stand-in's scale doubled) is caught."""
    real = varlen_stand_in.STAND_INS["torch-2.14"]
    varlen_stand_in.install(monkeypatch, "torch-2.14")
    import torch.nn.attention.varlen

    @functools.wraps(real)  # the same signature: flash.py reads its parameters
    def off(*args, scale=None, **kwargs):
        return real(*args, scale=2 * (args[0].shape[-1] ** -0.5 if scale is None else scale), **kwargs)

    monkeypatch.setattr(torch.nn.attention.varlen, "varlen_attn", off)
    check = gpu_check_correctness.checks(True, CPU, tmp_path, backend="flash")["band string 48"]
    with pytest.raises(AssertionError, match="relative errors"):
        check()


def test_a_design_check_can_fail(tmp_path, monkeypatch):
    """A flash path that drops the sliding window (causal instead of the band) is caught."""
    from longctx.model import flash, packed_attention

    varlen_stand_in.install(monkeypatch, "torch-2.14")
    monkeypatch.setattr(packed_attention, "_flash_window", lambda q_len, window: flash.CAUSAL)
    check = gpu_check_correctness.checks(True, CPU, tmp_path, backend="flash")["design sliding 48"]
    with pytest.raises(AssertionError, match="sliding: logits relative L2 error"):
        check()


def test_smoke_runs_every_part_and_writes_their_tables_and_the_summary(tmp_path):
    """Through `make gpu-check` as a user runs it (the Makefile's path setup and the driver's
    place in tools/gpu), with GPU_CHECK_ARGS=--smoke: the CPU smoke of the gpu-check and
    gpu-check-tools steps."""
    out = tmp_path / "out"
    command = ["make", "-s", "gpu-check", f"PYTHON_GPU={sys.executable}", f"BENCH_OUT={out}", "GPU_CHECK_ARGS=--smoke"]
    env = gpu_image_environment(tmp_path)  # no wandb, as on the GPU image
    result = subprocess.run(command, cwd=REPOSITORY, capture_output=True, text=True, timeout=600, env=env)
    logs = "".join(path.read_text()[-2000:] for path in sorted(out.glob("*.log")))
    assert result.returncode == 0, result.stdout[-3000:] + logs
    summary = json.loads((out / "gpu_check.json").read_text())
    assert [row[0] for row in summary["rows"]] == ["correctness", "training", "kernels", "long-context"]
    assert all(row[1] == "ok" for row in summary["rows"]), summary["rows"]
    checks = json.loads((out / "correctness.json").read_text())
    assert len(checks["rows"]) == 19 and all(row[1] == "passed" for row in checks["rows"]), checks["rows"]
    for table in ("train_step", "positions_debug"):
        record = json.loads((out / f"{table}.json").read_text())
        assert record["settings"]["device"] == "CPU" and record["rows"], record
    assert "| correctness | ok |" in (out / "gpu_check.md").read_text()


def script(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / f"{name}.py"
    path.write_text("import sys, time, pathlib\nout = pathlib.Path(sys.argv[sys.argv.index('--out') + 1])\n" + body)
    return str(path)  # absolute: gpu_check joins it to the repository root unchanged


CORRECTNESS_TABLE = (
    "import json\nrows = [['a', 'passed', '', '0'], ['b', {result!r}, '', '0']]\n"
    "(out / 'correctness.json').write_text(json.dumps({{'rows': rows}}))\n"
)


def test_a_part_past_its_limit_is_stopped_and_the_next_part_runs(tmp_path):
    slow = script(tmp_path, "slow", "time.sleep(60)\n")
    quick = script(tmp_path, "quick", "(out / 'quick.json').write_text('{}')\n")
    parts = [gpu_check.Part("slow", 1, ((slow,),), ()), gpu_check.Part("quick", 30, ((quick,),), ("quick",))]
    status = gpu_check.run(parts, tmp_path / "out")
    rows = json.loads((tmp_path / "out" / "gpu_check.json").read_text())["rows"]
    assert rows[0][:2] == ["slow", "stopped at its limit (1 s)"] and float(rows[0][2]) < 15
    assert rows[1][:2] == ["quick", "ok"] and rows[1][4] == "quick"
    assert status == 2  # no correctness check failed, but a part did not finish


TABLE = "(out / '{name}.json').write_text('{{}}')\n(out / '{name}.md').write_text('| a |')\n"


def test_a_part_ends_as_soon_as_its_final_tables_are_written(tmp_path):
    """A script that writes its table and then lingers (teardown) is stopped after
    TABLES_GRACE_S and reported ok, far before its limit; the same script in a part
    without final tables runs to its limit."""
    lingering = script(tmp_path, "lingering", TABLE.format(name="table") + "time.sleep(60)\n")
    ends = gpu_check.Part("ends", 30, ((lingering,),), ("table",), final_tables=("table",))
    waits = gpu_check.Part("waits", 4, ((lingering,),), ("table",))
    status = gpu_check.run([ends, waits], tmp_path / "out")
    rows = json.loads((tmp_path / "out" / "gpu_check.json").read_text())["rows"]
    assert rows[0][:2] == ["ends", "ok"] and float(rows[0][2]) < gpu_check.TABLES_GRACE_S + 8, rows[0]
    assert rows[0][4] == "table" and "tables are written" in (tmp_path / "out" / "ends.log").read_text()
    assert rows[1][:2] == ["waits", "stopped at its limit (4 s)"]
    assert status == 2


def test_a_table_written_before_the_last_command_does_not_end_it(tmp_path):
    """Two commands writing the same table (the smoke's long-context part): the second
    runs to its end although the table exists when it starts."""
    first = script(tmp_path, "first", TABLE.format(name="table"))
    second = script(
        tmp_path, "second", "time.sleep(4)\n(out / 'second.txt').write_text('done')\n" + TABLE.format(name="table")
    )
    part = gpu_check.Part("two", 30, ((first,), (second,)), ("table",), final_tables=("table",))
    assert gpu_check.run([part], tmp_path / "out") == 0
    assert (tmp_path / "out" / "second.txt").read_text() == "done"


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (CORRECTNESS_TABLE.format(result="FAILED") + "sys.exit(1)\n", 1),
        (CORRECTNESS_TABLE.format(result="passed"), 0),
        (CORRECTNESS_TABLE.format(result="passed") + "time.sleep(60)\n", 1),  # unfinished: unproven
    ],
    ids=["failed-check", "passed", "stopped"],
)
def test_exit_status_is_non_zero_when_a_correctness_check_failed(tmp_path, body, expected):
    correctness = script(tmp_path, "correctness", body)
    parts = [gpu_check.Part("correctness", 3, ((correctness,),), ("correctness",))]
    assert gpu_check.run(parts, tmp_path / "out") == expected
    summary = (tmp_path / "out" / "gpu_check.md").read_text()
    assert ("failed: b" in summary) == (expected == 1 and "FAILED" in body)


def test_parts_option_names_only_known_parts(tmp_path):
    command = [sys.executable, "tools/gpu/gpu_check.py", "--out", str(tmp_path), "--parts", "speed"]
    result = subprocess.run(command, cwd=REPOSITORY, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "unknown parts ['speed']" in result.stderr


def test_useful_flops_count_only_the_pairs_document_masking_keeps():
    """Hand-worked: rows of 5 tokens, documents of 2 and 3 tokens -> 3 + 6 = 9 pairs for 5
    tokens, against 15 for one document (the MFU formula's causal T, up to T+1)."""
    sys.path.insert(0, str(REPOSITORY / "benchmarks"))
    try:
        from train_gpu import useful_flops_per_token
    finally:
        sys.path.remove(str(REPOSITORY / "benchmarks"))
    import torch

    from longctx.config.model import ModelConfig

    config = ModelConfig.from_preset("debug")
    layers, width = config.n_layers, config.d_model
    matmul = 6 * (config.num_parameters() - config.vocab_size * width - (2 * layers + 1) * width)
    packed = useful_flops_per_token(config, torch.tensor([[0, 0, 1, 1, 1]]))
    whole = useful_flops_per_token(config, torch.zeros(1, 5, dtype=torch.long))
    assert packed == pytest.approx(matmul + 12 * layers * width * 9 / 5)
    assert whole == pytest.approx(matmul + 12 * layers * width * 15 / 5)
