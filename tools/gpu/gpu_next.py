"""The next GPU step in one device call: `make gpu-next` runs the first step of the committed
checklist (tools/gpu/gpu_steps.toml) that is ready and not done.

    python tools/gpu/gpu_next.py plan             # here: the steps, the next one's call
    source .device/env.sh; python3 tools/gpu/gpu_next.py run --out $OUT   # the device call
    python tools/gpu/gpu_next.py tick FILES_AT     # here, after the call: commit the outputs

GPU time comes on the lender's terms (tools/lender.toml: a session's device time, a machine's
start included, one command's limit, what a call carries in and what comes back), so each
session should need one prepared command per step. `plan` prints each step's state and the next call (carry list, command, timeout) and checks
what it carries first: the staged sets' locks (tools/gpu/staging.py) and that the carried
folders exist. `run` (the GPU side) runs the step's command in its own process group with a
hard limit, packs the step's outputs into $OUT/<id>.tar.xz and writes $OUT/gpu_next.json
(step, status, seconds, content hash, device, versions, what comes next): two files back
whatever the step writes. `tick` unpacks that archive into the step's results folder and
appends a `[[step.done]]` record to the checklist, so the commit that follows ticks the step.

A step is done when it has a record and, for a `repeat` step, the content hash of its
`repeat` paths still equals the record's (the GPU path changed: gpu-check is due again), or,
for a `resume` step, its last record is complete. The hash is computed from the files
themselves, so the GPU machine (no .git there) picks the same step as `plan` here.
"""

from __future__ import annotations

import argparse
import ast
import datetime
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[2]
STEPS = Path(__file__).resolve().parent / "gpu_steps.toml"
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tools/: lender.py
import lender  # noqa: E402  (a script directory, not a package)

TERMS = lender.load()
MAX_LIMIT_S = TERMS.step_s
"""A step's limit: the lender's command limit less room for start-up and the transfers."""
MAX_FILE_MIB = TERMS.file_mib
"""The largest file that comes back from a device call."""
MAX_CALL_MIB = TERMS.carry_mib
"""What one device call takes along: the working tree (tracked and untracked files git does
not ignore) and its carried paths together."""
SETUP_CARRY = re.compile(r"carry (\[[^\]]*\]):")
"""A setup call is written `carry [paths]: command`."""
CALL_MARGIN_S = 60
"""What `plan` adds to a step's limit for the call's timeout (packing, the summary)."""
STEP_KEYS = {"id", "what", "carry", "command", "limit_s", "ready", "waits", "repeat", "resume", "resume_step"}
STEP_KEYS |= {"complete", "setup", "results", "done"}
STAGED = {
    ".device": "base",
    ".device-hf": "hf",
    ".device-ruler": "ruler",
    ".device-fa4": "fa4",
    ".device-wandb": "wandb",
}
"""Staged folder -> its staging set (tools/gpu/staging/sets.toml); a call may carry the
folder or paths under it (`make device-fa4` sends its set in parts)."""
SKIPPED_PARTS = {"__pycache__", ".pytest_cache"}


@dataclass
class Step:
    id: str
    what: str
    carry: list[str]
    command: str
    limit_s: int
    ready: bool
    waits: str = ""
    repeat: list[str] = field(default_factory=list)
    resume: str = ""
    resume_step: str = ""
    complete: list[str] = field(default_factory=list)
    setup: list[str] = field(default_factory=list)
    results: str = ""
    done: list[dict] = field(default_factory=list)


def load_steps(path: Path = STEPS) -> list[Step]:
    steps = []
    for index, body in enumerate(tomllib.loads(path.read_text())["step"]):
        unknown = set(body) - STEP_KEYS
        if unknown:
            raise ValueError(f"{path}: step {index} ({body.get('id', '?')}) has unknown keys {sorted(unknown)}")
        step = Step(**body)
        if step.limit_s > MAX_LIMIT_S:
            raise ValueError(f"{path}: step {step.id}: limit_s {step.limit_s} > {MAX_LIMIT_S} (one call's budget)")
        if step.ready and not step.command:
            raise ValueError(f"{path}: step {step.id} is ready but has no command")
        setup_carries(step)  # each setup call names its carry list
        steps.append(step)
    return steps


def content_hash(paths: list[str], root: Path | None = None) -> str:
    """sha256 over the relative path and bytes of every file under `paths`, in sorted order
    (caches and egg-info left out): equal here and on the GPU machine for the same tree."""
    root = root or REPOSITORY
    digest = hashlib.sha256()
    for name in paths:
        top = root / name
        files = [top] if top.is_file() else sorted(p for p in top.rglob("*") if p.is_file())
        for file in files:
            relative = file.relative_to(root)
            if SKIPPED_PARTS & set(relative.parts) or file.suffix == ".pyc" or ".egg-info" in str(relative):
                continue
            digest.update(str(relative).encode() + b"\0" + file.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def state(step: Step, root: Path | None = None) -> str:
    """'waits', 'done', 'partial' (a resumable step begun) or 'due'."""
    if not step.ready:
        return "waits"
    last = step.done[-1] if step.done else None
    if last is None:
        return "due"
    if step.complete:
        return "done" if last.get("status") == "complete" else "partial"
    if last.get("status") != "ok":
        return "due"
    if step.repeat and last.get("hash") != content_hash(step.repeat, root):
        return "due"
    return "done"


def next_step(steps: list[Step], root: Path | None = None) -> Step | None:
    return next((step for step in steps if state(step, root) in ("due", "partial")), None)


def resume_argument(step: Step, steps: list[Step]) -> str:
    """`--resume-from <archive>` from the last record of the step the archive comes from."""
    if not step.resume:
        return ""
    source = next(s for s in steps if s.id == (step.resume_step or step.id))
    for record in reversed(source.done):
        archive = Path(record["results"]) / step.resume
        if (REPOSITORY / archive).exists():
            return f"--resume-from {shlex.quote(str(archive))}"
    return ""


def plan(steps: list[Step]) -> int:
    for listed in steps:
        label = state(listed)
        extra = f" ({listed.waits})" if label == "waits" else ""
        last = f", last {listed.done[-1]['date']} on {listed.done[-1]['device']}" if listed.done else ""
        print(f"{label:>8}  {listed.id}{extra}{last}")
    step = next_step(steps)
    if step is None:
        print("\nevery ready step is done")
        return 0
    print(f"\nnext: {step.id}: {step.what}")
    problems = carry_problems(step)
    for line in step.setup:
        print(f"  first, on the same warm machine: {line}")
    print(f"  carry {json.dumps(step.carry)}, timeout_s {step.limit_s + CALL_MARGIN_S}")
    prefix = "source .device/env.sh; " if ".device" in step.carry else ""
    # python, not make: the image is not known to have make (`make gpu-next` runs the same)
    print(f"  command: {prefix}WANDB_MODE=disabled python3 tools/gpu/gpu_next.py run --out $OUT")
    for problem in problems:
        print(f"  NOT READY: {problem}")
    return 1 if problems else 0


def setup_carries(step: Step) -> list[list[str]]:
    """The carry list of each of the step's setup calls (`carry ['a', 'b']: command`)."""
    carries = []
    for index, line in enumerate(step.setup, 1):
        match = SETUP_CARRY.match(line)
        if match is None:
            raise ValueError(f"step {step.id}: setup call {index} does not start with `carry [paths]:`")
        carries.append([str(path) for path in ast.literal_eval(match.group(1))])
    return carries


def size_bytes(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else 0


def tree_bytes() -> int:
    """The working tree a device call copies (git's tracked and untracked-not-ignored files);
    0 outside a git checkout."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPOSITORY, capture_output=True)
    if listed.returncode != 0:
        return 0
    return sum(size_bytes(REPOSITORY / name) for name in listed.stdout.decode().split("\0") if name)


def call_problems(step: Step) -> list[str]:
    """Each setup call's carried paths present here, and every call (the setup calls and the
    step's own) within MAX_CALL_MIB with the working tree."""
    problems = []
    tree = tree_bytes()
    calls = [(f"setup call {index}", carry) for index, carry in enumerate(setup_carries(step), 1)]
    for name, carry in [*calls, ("the step's call", step.carry)]:
        missing = [path for path in carry if not (REPOSITORY / path).exists()]
        if name != "the step's call":
            problems += [f"{path} ({name}) is not here" for path in missing]
        mib = (tree + sum(size_bytes(REPOSITORY / path) for path in carry)) / 2**20
        if mib > MAX_CALL_MIB:
            problems.append(f"{name} takes {mib:.1f} MiB with the working tree, over the {MAX_CALL_MIB} MiB of a call")
    return problems


def carry_problems(step: Step) -> list[str]:
    """A carried folder missing here, a staged set (carried by any call of the step, whole
    or by paths under its folder) whose wheels differ from its lock or whose lock has a gap,
    or a call (setup calls included) that lacks its carried paths or takes more than
    MAX_CALL_MIB."""
    here = str(Path(__file__).resolve().parent)
    if here not in sys.path:  # run as a script it is there; imported by the tests it may not be
        sys.path.insert(0, here)
    import staging

    problems = []
    for path in step.carry:
        if not (REPOSITORY / path).exists():
            problems.append(f"{path} is not here (make {Path(path).parts[0].lstrip('.')})")
    sets, image = staging.load_sets(), staging.load_image()
    carried = [*step.carry, *(path for carry in setup_carries(step) for path in carry)]
    for path in dict.fromkeys(Path(path).parts[0] for path in carried):
        name = STAGED.get(path)
        if name is None:
            continue
        locked = staging.read_lock(staging.lock_path(name))
        on_disk = {p.name for p in (REPOSITORY / path / "whl").glob("*.whl")}
        if (REPOSITORY / path).exists() and {wheel.file for wheel in locked} != on_disk:
            problems.append(f"{path}/whl differs from staging/{name}.lock.json: run its make target again")
        gaps = staging.unmet(locked, image, sets[name].allow, sets[name].no_deps)
        problems += [f"{name}: {gap}" for gap in gaps]
    return problems + call_problems(step)


def device_facts() -> dict[str, str]:
    facts = {"date": datetime.date.today().isoformat(), "device": "cpu", "torch": "", "cuda": ""}
    try:
        import torch

        facts["torch"] = torch.__version__
        facts["cuda"] = torch.version.cuda or ""
        if torch.cuda.is_available():
            facts["device"] = torch.cuda.get_device_name()
    except ImportError:
        pass
    return facts


def run_limited(command: str, limit_s: int, log: Path) -> tuple[str, int]:
    """(status, exit code): 'ok', 'failed' or 'stopped' (killed at the limit, group and all)."""
    with log.open("w") as console:
        process = subprocess.Popen(
            ["bash", "-c", command], cwd=REPOSITORY, stdout=console, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            code = process.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            return "stopped", -9
    return ("ok" if code == 0 else "failed"), code


def run(steps: list[Step], out: Path, step_id: str | None = None) -> int:
    """Run the next due step, or `step_id` (a window too short for the next one may still
    fit a later step: the plan names it)."""
    step = next_step(steps) if step_id is None else _named(steps, step_id)
    out.mkdir(parents=True, exist_ok=True)
    if step is None:
        print("gpu-next: every ready step is done")
        return 0
    work = out / step.id
    work.mkdir(exist_ok=True)
    command = step.command.format(out=shlex.quote(str(work)), resume=resume_argument(step, steps))
    print(f"gpu-next: {step.id}: {step.what}\n  {command}\n  limit {step.limit_s} s", flush=True)
    started = time.monotonic()
    status, code = run_limited(command, step.limit_s, work / "console.log")
    seconds = round(time.monotonic() - started, 1)
    if step.complete and status in ("ok", "stopped"):
        status = "complete" if is_complete(step, work) else "partial"
    tail = (work / "console.log").read_text().splitlines()[-25:]
    with tarfile.open(out / f"{step.id}.tar.xz", "w:xz") as archive:
        archive.add(work, arcname=step.id)
    shutil.rmtree(work)  # what comes back: this archive and the summary (8 files at most)
    size_mib = (out / f"{step.id}.tar.xz").stat().st_size / 2**20
    if size_mib > MAX_FILE_MIB:
        print(f"gpu-next: {step.id}.tar.xz is {size_mib:.1f} MiB, over the {MAX_FILE_MIB} MiB that comes back")
    remaining = [s for s in steps if s is not step and state(s) in ("due", "partial")]
    upcoming = step.id if status == "partial" else (remaining[0].id if remaining else "")
    summary = {"step": step.id, "status": status, "exit": code, "seconds": seconds, **device_facts()}
    summary |= {"hash": content_hash(step.repeat) if step.repeat else "", "next": upcoming}
    (out / "gpu_next.json").write_text(json.dumps(summary, indent=1) + "\n")
    print("\n".join(tail))
    print(f"gpu-next: {step.id} {status} (exit {code}) in {seconds} s; outputs in {step.id}.tar.xz")
    print(f"gpu-next: next: {upcoming or 'nothing ready'}; here: python tools/gpu/gpu_next.py tick <files_at>")
    return 0 if status in ("ok", "complete", "partial") else 1


def is_complete(step: Step, work: Path) -> bool:
    file = work / step.complete[0]
    return file.exists() and (len(step.complete) < 2 or step.complete[1] in file.read_text())


def device_slug(device: str) -> str:
    match = re.search(r"\b([AHB]\d{2,3})\b", device)
    return match.group(1).lower() if match else re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-")


def tick(steps: list[Step], files_at: Path, path: Path = STEPS) -> int:
    """Unpack the call's archive into the step's results folder and record the call."""
    summary = json.loads((files_at / "gpu_next.json").read_text())
    step = next(s for s in steps if s.id == summary["step"])
    results = Path(step.results or f"docs/gpu-results/{device_slug(summary['device'])}-{summary['date']}/{step.id}")
    target = REPOSITORY / results
    target.mkdir(parents=True, exist_ok=True)
    with tarfile.open(files_at / f"{step.id}.tar.xz") as archive:
        for member in archive.getmembers():
            if not member.isfile():
                continue
            name = Path(member.name).relative_to(step.id)
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            extracted = archive.extractfile(member)
            assert extracted is not None
            (target / name).write_bytes(extracted.read())
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPOSITORY, capture_output=True, text=True)
    record = {
        "commit": commit.stdout.strip(),
        "date": summary["date"],
        "device": summary["device"],
        "torch": summary["torch"],
        "status": summary["status"],
        "seconds": summary["seconds"],
        "hash": summary["hash"],
        "results": str(results),
    }
    append_record(path, step.id, record)
    print(f"{step.id}: {summary['status']}; outputs in {results}; recorded in {path.name}: commit both")
    return 0


def append_record(path: Path, step_id: str, record: dict) -> None:
    """Insert `[[step.done]]` at the end of the step's block (before the next `[[step]]`)."""
    text = path.read_text()
    start = text.index(f'id = "{step_id}"')
    following = text.find("\n[[step]]", start)
    head, rest = (text, "") if following == -1 else (text[:following], text[following:])
    lines = "\n".join(f"{key} = {json.dumps(value)}" for key, value in record.items())
    path.write_text(head.rstrip("\n") + f"\n\n[[step.done]]\n{lines}\n" + rest)


def _named(steps: list[Step], step_id: str) -> Step:
    for step in steps:
        if step.id == step_id:
            if not step.ready:
                raise SystemExit(f"gpu-next: step {step_id!r} is not ready: {step.waits}")
            return step
    raise SystemExit(f"gpu-next: no step {step_id!r}; steps: {', '.join(s.id for s in steps)}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("plan")
    runner = commands.add_parser("run")
    runner.add_argument("--out", type=Path, required=True)
    runner.add_argument("--step", help="run this step instead of the next due one")
    commands.add_parser("tick").add_argument("files_at", type=Path)
    args = parser.parse_args()
    steps = load_steps()
    if args.command == "plan":
        return plan(steps)
    if args.command == "run":
        return run(steps, args.out, args.step)
    return tick(steps, args.files_at)


if __name__ == "__main__":
    sys.exit(main())
