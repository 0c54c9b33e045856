"""`make gpu-next` (tools/gpu/gpu_next.py): the committed checklist of GPU steps, the step
it picks, one call's outputs packed into what comes back, and the record `tick` commits."""

import json
import math
import re
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SAVED_PATH = list(sys.path)
sys.path.insert(0, str(ROOT / "tools" / "gpu"))
import gpu_next  # noqa: E402  (a script directory, not a package)

sys.path[:] = SAVED_PATH

ISSUE_ORDER = [
    "main-job",
    "gpu-check",
    "gpu-check-tools",
    "speed-decode",
    "designs",
    "checkpoints-2025",
    "test-gpu",
    "speed-niah-profiles",
    "speed-training",
    "speed-fa4",
    "table1-smollm2",
    "table1-smollm2-agreement",
    "ruler-smollm2",
    "twin-tuning",
    "twin-seeds",
    "eval-ranks",
    "context-parallel",
    "dpe-smollm2-16k",
    "fla-kernels",
]


def test_the_checklist_is_in_order_and_each_ready_step_names_scripts_that_exist():
    steps = gpu_next.load_steps()
    assert [step.id for step in steps] == ISSUE_ORDER
    for step in steps:
        assert step.limit_s + gpu_next.CALL_MARGIN_S <= gpu_next.TERMS.command_s, step.id
        if step.ready:
            for script in [word for word in step.command.split() if word.endswith((".py", ".yaml"))]:
                assert (ROOT / script).exists(), f"{step.id}: {script}"
        else:
            assert step.waits, step.id
        missing = [path for path in step.repeat if not (ROOT / path).exists()]
        assert not missing, f"{step.id}: repeat paths that do not exist (the step would never be due again): {missing}"
    assert gpu_next.next_step(steps).id == "main-job"  # no GPU has run it yet


def test_plan_lists_the_main_job_first_and_names_it_next(capsys):
    """The main job leads the checklist: a GPU window spends its first call on it."""
    gpu_next.plan(gpu_next.load_steps())
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["due", "main-job"]
    order = [line.split()[1].rstrip(",") for line in lines[1:6]]  # "<state>  <id>[, last <date> on <device>]"
    assert order == ["gpu-check", "gpu-check-tools", "speed-decode", "designs", "checkpoints-2025"]
    assert any(line.startswith("next: main-job: ") for line in lines)


WANDB_BYTES = 24_281_616
"""`make device-wandb`'s 18 wheels, as staged (tools/gpu/staging/wandb.lock.json)."""


def test_the_main_job_fits_its_limit_and_one_call_with_room(tmp_path, monkeypatch):
    """main-job: at most 420 s (its script's budget is 390 s of it), its command the script
    with the wandb set sourced; .device and .device-wandb at their measured sizes (sparse)
    with this checkout's working tree fit MAX_CALL_MIB less 6 MiB (room for the tree to grow;
    it measured 6.8 MiB, the two wheel sets 49.1 MiB)."""
    step = next(step for step in gpu_next.load_steps() if step.id == "main-job")
    assert step.ready and step.limit_s <= 420 and step.carry == [".device", ".device-wandb"]
    assert (
        step.command == "source .device-wandb/env.sh && python3 benchmarks/main_job_gpu.py --out {out} --budget-s 390"
    )
    assert "benchmarks/main_job_gpu.py" in step.repeat and "src/longctx" in step.repeat
    tree = gpu_next.tree_bytes()
    if tree == 0:
        pytest.skip("not a git checkout: the working tree a call copies cannot be listed")
    for path, size in {".device/whl/all.whl": DEVICE_BYTES, ".device-wandb/whl/all.whl": WANDB_BYTES}.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        with (tmp_path / path).open("wb") as handle:
            handle.truncate(size)
    monkeypatch.setattr(gpu_next, "REPOSITORY", tmp_path)
    monkeypatch.setattr(gpu_next, "tree_bytes", lambda: tree)
    monkeypatch.setattr(gpu_next, "MAX_CALL_MIB", gpu_next.MAX_CALL_MIB - 6)
    assert gpu_next.call_problems(step) == []
    monkeypatch.setattr(gpu_next, "MAX_CALL_MIB", 40)
    assert [problem.split(" takes")[0] for problem in gpu_next.call_problems(step)] == ["the step's call"]


def write_steps(path: Path, body: str) -> Path:
    path.write_text(body)
    return path


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            '[[step]]\nid = "a"\nwhat = ""\ncarry = []\ncommand = "x"\nlimit_s = 1\nready = true\nlimit = 2\n',
            "unknown keys",
        ),
        ('[[step]]\nid = "a"\nwhat = ""\ncarry = []\ncommand = "x"\nlimit_s = 541\nready = true\n', "limit_s 541"),
        ('[[step]]\nid = "a"\nwhat = ""\ncarry = []\ncommand = ""\nlimit_s = 1\nready = true\n', "no command"),
        (
            '[[step]]\nid = "a"\nwhat = ""\ncarry = []\ncommand = "x"\nlimit_s = 1\nready = true\nsetup = ["cp a b"]\n',
            r"step a: setup call 1 does not start with `carry \[paths\]:`",
        ),
    ],
)
def test_a_bad_checklist_names_the_step_and_key(tmp_path, body, message):
    with pytest.raises(ValueError, match=message):
        gpu_next.load_steps(write_steps(tmp_path / "steps.toml", body))


STEPS = """
[[step]]
id = "check"
what = "writes a table"
carry = []
command = "echo measured > {out}/table.md"
limit_s = 20
ready = true
repeat = ["code"]

[[step]]
id = "later"
what = "not written yet"
carry = []
command = ""
limit_s = 20
ready = false
waits = "its script"

[[step]]
id = "long"
what = "resumes over calls"
carry = []
command = "echo {resume} > {out}/args.txt; echo x > {out}/cells.tar.xz; sleep 30"
limit_s = 2
ready = true
resume = "cells.tar.xz"
complete = ["done.md"]
"""


@pytest.fixture()
def checkout(tmp_path, monkeypatch):
    """A repository root of its own: a `code` folder, the checklist above."""
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "model.py").write_text("x = 1\n")
    monkeypatch.setattr(gpu_next, "REPOSITORY", tmp_path)
    return tmp_path, write_steps(tmp_path / "steps.toml", STEPS)


def call(root: Path, steps_file: Path, name: str) -> Path:
    """One device call and its tick: what comes back lands in root/back-<name>."""
    out = root / f"out-{name}"
    assert gpu_next.run(gpu_next.load_steps(steps_file), out) == 0
    back = root / f"back-{name}"
    shutil.copytree(out, back)
    assert sorted(p.name for p in back.iterdir()) == sorted(
        ["gpu_next.json", f"{json.loads((back / 'gpu_next.json').read_text())['step']}.tar.xz"]
    )
    gpu_next.tick(gpu_next.load_steps(steps_file), back, steps_file)
    return back


def test_a_step_is_done_until_its_code_changes_and_a_resumable_one_until_complete(checkout):
    root, steps_file = checkout
    first = call(root, steps_file, "1")
    summary = json.loads((first / "gpu_next.json").read_text())
    assert summary["step"] == "check" and summary["status"] == "ok" and summary["next"] == "long"
    record = gpu_next.load_steps(steps_file)[0].done[-1]
    assert (root / record["results"] / "table.md").read_text() == "measured\n"
    assert (root / record["results"] / "console.log").exists()
    # the next call skips the done step and the waiting one; the long one is stopped at its limit
    second = call(root, steps_file, "2")
    summary = json.loads((second / "gpu_next.json").read_text())
    assert (summary["step"], summary["status"], summary["next"]) == ("long", "partial", "long")
    steps = gpu_next.load_steps(steps_file)
    assert [gpu_next.state(step, root) for step in steps] == ["done", "waits", "partial"]
    # its next call resumes from the archive the last one left
    resumed = gpu_next.resume_argument(steps[2], steps)
    assert resumed == f"--resume-from {steps[2].done[-1]['results']}/cells.tar.xz"
    # a change to the step's `repeat` paths makes it due again, ahead of the long one
    (root / "code" / "model.py").write_text("x = 2\n")
    assert gpu_next.next_step(gpu_next.load_steps(steps_file), root).id == "check"


def test_a_step_past_its_limit_is_killed_with_its_children(checkout, tmp_path):
    marker = tmp_path / "survived"
    status, _ = gpu_next.run_limited(f"(sleep 3; touch {marker}) & sleep 30", 1, tmp_path / "log")
    assert status == "stopped"
    import time

    time.sleep(3.5)
    assert not marker.exists()


def test_plan_names_what_a_call_would_lack_before_it_is_made(tmp_path, monkeypatch, capsys):
    """A carried folder not staged here, or staged from another lock, stops the plan (exit 1)."""
    monkeypatch.setattr(gpu_next, "REPOSITORY", tmp_path)
    (tmp_path / ".device" / "whl").mkdir(parents=True)
    (tmp_path / ".device" / "whl" / "omegaconf-0.0.1-py3-none-any.whl").write_bytes(b"")
    step = gpu_next.Step("x", "", [".device", ".device-hf"], "true", 10, True)
    assert gpu_next.carry_problems(step) == [
        ".device-hf is not here (make device-hf)",
        ".device/whl differs from staging/base.lock.json: run its make target again",
    ]
    assert gpu_next.plan([step]) == 1
    assert "NOT READY: .device-hf is not here" in capsys.readouterr().out


def test_run_may_name_a_later_step_and_refuses_one_not_ready(checkout):
    """A window too short for the next due step runs a named one instead."""
    root, steps_file = checkout
    steps = gpu_next.load_steps(steps_file)
    out = root / "named"
    assert gpu_next.run(steps, out, "long") == 0
    assert json.loads((out / "gpu_next.json").read_text())["step"] == "long"
    waiting = next(step.id for step in steps if not step.ready)
    with pytest.raises(SystemExit, match="is not ready"):
        gpu_next.run(steps, root / "other", waiting)
    with pytest.raises(SystemExit, match="no step 'nope'"):
        gpu_next.run(steps, root / "other", "nope")


def test_plan_names_a_setup_call_that_lacks_its_part_or_carries_more_than_a_call_takes(tmp_path, monkeypatch):
    """Each setup call's `carry [paths]` must be here, and every call (setup calls and the
    step's own) must fit MAX_CALL_MIB with the working tree (here: none, not a git checkout)."""
    monkeypatch.setattr(gpu_next, "REPOSITORY", tmp_path)
    monkeypatch.setattr(gpu_next, "MAX_CALL_MIB", 1)
    (tmp_path / "parts").mkdir()
    (tmp_path / "parts" / "part-000-of-002").write_bytes(b"x" * (2 * 2**20))
    (tmp_path / "small").write_bytes(b"x")
    setup = [
        "carry ['parts/part-000-of-002']: cp parts/part-000-of-002 /tmp/",
        "carry ['parts/part-001-of-002', 'small']: cp parts/part-001-of-002 /tmp/",
    ]
    step = gpu_next.Step("x", "", ["small"], "true", 10, True, setup=setup)
    assert gpu_next.setup_carries(step) == [["parts/part-000-of-002"], ["parts/part-001-of-002", "small"]]
    assert gpu_next.carry_problems(step) == [
        "setup call 1 takes 2.0 MiB with the working tree, over the 1 MiB of a call",
        "parts/part-001-of-002 (setup call 2) is not here",
    ]


def test_the_gemma3_steps_setup_calls_send_every_part_once_and_join_them_last():
    """checkpoints-2025: eight parts of the GGUF, one per call; the last call, which carries the
    wheels it installs, joins them with the hash and converts; the step sources the RULER set
    its niah_single_2 haystack needs (punkt)."""
    step = next(step for step in gpu_next.load_steps() if step.id == "checkpoints-2025")
    carries = gpu_next.setup_carries(step)
    parts = [path for carry in carries for path in carry if "gguf_parts_gemma3" in path]
    assert parts == [f"runs/gguf_parts_gemma3/part-{k:03d}-of-008" for k in range(8)]
    assert ".device" in carries[-1] and "source .device/env.sh" in step.setup[-1]
    assert "gguf_parts.py join" in step.setup[-1] and "convert-gguf" in step.setup[-1]
    assert ".device-ruler" in step.carry and "source .device-ruler/env.sh" in step.command


FA4_LARGE_WHEEL_BYTES = 91_954_433
"""nvidia-cutlass-dsl-libs-cu13 4.8.1's wheel, as staged (Makefile, device-fa4)."""
FA4_OTHER_WHEELS_BYTES = 10_164_113
"""The fa4 set's other 7 wheels, carried by the step's own call in .device-fa4/step."""
DEVICE_BYTES = 25_083_319 + 2 * 2**20
"""`.device` as measured in a checkout, with 2 MiB for wheels added to the base set since."""


def fa4_step() -> gpu_next.Step:
    return next(step for step in gpu_next.load_steps() if step.id == "speed-fa4")


def fa4_part_bytes() -> int:
    """The size of each part but the last, FA4_PART_MIB in the Makefile."""
    part_mib = re.search(r"^FA4_PART_MIB\s*:=\s*(\S+)", (ROOT / "Makefile").read_text(), re.M).group(1)
    return int(float(part_mib) * 2**20)


def test_the_fa4_steps_setup_calls_send_each_part_once_and_join_the_locked_wheel_with_its_hash():
    """speed-fa4: the large DSL wheel of the fa4 lock in as many parts as `make device-fa4`
    cuts (FA4_PART_MIB), one per setup call into /tmp/fa4-parts, joined by the last with the
    SHA-256; the step's call carries .device and the rest, and sources the set's env.sh."""
    step = fa4_step()
    count = math.ceil(FA4_LARGE_WHEEL_BYTES / fa4_part_bytes())
    carries = gpu_next.setup_carries(step)
    assert carries == [[f".device-fa4/parts/part-{k:03d}-of-{count:03d}"] for k in range(count)]
    (large,) = [w.file for w in staging_lock("fa4") if w.name == "nvidia-cutlass-dsl-libs-cu13"]
    assert f"gguf_parts.py join /tmp/fa4-parts /tmp/fa4-whl/{large} --sha256 " in step.setup[-1]
    assert all("/tmp/fa4-parts/" in line for line in step.setup)
    assert step.ready and step.carry == [".device", ".device-fa4/step"]
    assert step.command.startswith("source .device-fa4/step/env.sh && python3 benchmarks/fa4_gpu.py --out {out}")


def staging_lock(name: str) -> list:
    sys.path.insert(0, str(ROOT / "tools" / "gpu"))
    try:
        import staging
    finally:
        sys.path.remove(str(ROOT / "tools" / "gpu"))
    return staging.read_lock(staging.lock_path(name))


def test_each_call_of_the_fa4_step_fits_a_call_with_room(tmp_path, monkeypatch):
    """The files as `make device-fa4` lays them out, at their measured sizes (sparse), with
    this checkout's working tree: every call within MAX_CALL_MIB less 8 MiB of room."""
    tree = gpu_next.tree_bytes()
    if tree == 0:
        pytest.skip("not a git checkout: the working tree a call copies cannot be listed")
    step = fa4_step()
    parts = [path for carry in gpu_next.setup_carries(step) for path in carry]
    size = fa4_part_bytes()
    sizes = {path: min(size, FA4_LARGE_WHEEL_BYTES - k * size) for k, path in enumerate(parts)}
    assert sum(sizes.values()) == FA4_LARGE_WHEEL_BYTES
    sizes |= {".device/whl/all.whl": DEVICE_BYTES, ".device-fa4/step/whl/rest.whl": FA4_OTHER_WHEELS_BYTES}
    for path, size in sizes.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        with (tmp_path / path).open("wb") as handle:
            handle.truncate(size)
    monkeypatch.setattr(gpu_next, "REPOSITORY", tmp_path)
    monkeypatch.setattr(gpu_next, "tree_bytes", lambda: tree)
    monkeypatch.setattr(gpu_next, "MAX_CALL_MIB", gpu_next.MAX_CALL_MIB - 6)
    monkeypatch.setattr(gpu_next, "STAGED", {})  # the lock comparison is the next test's
    assert gpu_next.call_problems(step) == []
    monkeypatch.setattr(gpu_next, "MAX_CALL_MIB", 40)
    assert [problem.split(" takes")[0] for problem in gpu_next.call_problems(step)] == [
        "setup call 1",
        "setup call 2",
        "the step's call",
    ]


def test_a_staged_set_carried_in_parts_is_checked_against_its_lock(tmp_path, monkeypatch):
    """Paths under .device-fa4 (the parts, the step folder) bring the fa4 lock's check: wheels
    staged from another lock, or not staged at all, are named before the call."""
    monkeypatch.setattr(gpu_next, "REPOSITORY", tmp_path)
    step = gpu_next.Step("x", "", [".device-fa4/step"], "true", 10, True, setup=["carry ['.device-fa4/parts/p']: true"])
    assert gpu_next.carry_problems(step) == [
        ".device-fa4/step is not here (make device-fa4)",
        ".device-fa4/parts/p (setup call 1) is not here",
    ]
    (tmp_path / ".device-fa4" / "whl").mkdir(parents=True)
    (tmp_path / ".device-fa4" / "whl" / "flash_attn_4-4.0.0b1-py3-none-any.whl").write_bytes(b"")
    assert ".device-fa4/whl differs from staging/fa4.lock.json: run its make target again" in gpu_next.carry_problems(
        step
    )
    for wheel in staging_lock("fa4"):
        (tmp_path / ".device-fa4" / "whl" / wheel.file).write_bytes(b"")
    (tmp_path / ".device-fa4" / "whl" / "flash_attn_4-4.0.0b1-py3-none-any.whl").unlink()
    assert not any("differs" in problem for problem in gpu_next.carry_problems(step))
