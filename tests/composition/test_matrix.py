"""The whole composition matrix (`make test-slow`): every shipped training configuration in
miniature under one process, ddp and fsdp on 2 gloo ranks, its probes firing
(tests/composition/helpers.py). Under fsdp, the NIAH cells equal one process's on the same
weights and f(i) equals the one-process cell's; the fsdp pretrain cell survives a kill.
The last test writes the table into docs/composition.md when the whole matrix ran."""

import hashlib
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.composition import helpers
from tests.composition.helpers import BY_NAME, CONFIGS

pytestmark = pytest.mark.slow

CELLS = [(config.name, strategy) for config in CONFIGS for strategy in config.strategies]
RESULTS: dict[tuple[str, str], dict] = {}
TABLE = helpers.ROOT / "docs" / "composition.md"
BEGIN, END = "<!-- composition table: begin -->", "<!-- composition table: end -->"


CODE = ("src", "experiments", "tests/composition/helpers.py")
"""What a cell's run depends on (the library, the configs, the miniature's overrides): a
finished run stands while these are unchanged."""
HARNESS = ("tests/composition",)
"""What its checks depend on: when these change, the kept runs are checked again."""


def code_key(paths: tuple[str, ...] = CODE) -> str:
    """git's tree hashes of `paths` as committed, with the working tree's changes to them,
    if any, hashed in ('' outside a git checkout)."""
    trees = subprocess.run(
        ["git", "rev-parse", *(f"HEAD:{path}" for path in paths)], cwd=helpers.ROOT, capture_output=True, text=True
    )
    diff = subprocess.run(["git", "diff", "HEAD", "--", *paths], cwd=helpers.ROOT, capture_output=True, text=True)
    if trees.returncode:
        return ""
    return hashlib.sha1((trees.stdout + diff.stdout).encode()).hexdigest()[:16]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    """LONGCTX_COMPOSITION_DIR/<code key> (a rerun there keeps every run of the same code,
    and every cell that passed under the same checks), else a fresh temporary directory."""
    chosen = os.environ.get("LONGCTX_COMPOSITION_DIR")
    if not chosen:
        return tmp_path_factory.mktemp("matrix")
    path = Path(chosen) / (code_key() or "unversioned")
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="module")
def pretrained(workspace) -> Path:
    """The one-process pretrain/tiny_512 cell's checkpoint: SFT's and extension's init."""
    out = workspace / "pretrain-tiny_512" / "single"
    if not (out / "checkpoints" / "last.ckpt").exists():
        helpers.run(BY_NAME["pretrain/tiny_512"], "single", out)
    return out / "checkpoints" / "last.ckpt"


@pytest.mark.parametrize(("name", "strategy"), CELLS, ids=[f"{n}-{s}" for n, s in CELLS])
def test_cell(name, strategy, workspace, pretrained):
    config = BY_NAME[name]
    init = pretrained if config.init else None
    out = workspace / config.slug / strategy
    kept, ran = (workspace / config.slug / f"{strategy}.{kind}.json" for kind in ("result", "run"))
    harness = code_key(HARNESS)
    earlier = json.loads(kept.read_text()) if kept.exists() else {}
    if earlier.get("pass") and earlier.get("harness") == harness:  # passed under these checks
        RESULTS[name, strategy] = earlier
        return
    reference = name == "pretrain/tiny_512" and strategy == "single"  # the `pretrained` fixture ran it
    RESULTS[name, strategy] = row = {"pass": False, "seconds": 0.0, "fired": {}, "checks": [], "harness": harness}
    started = time.monotonic()
    if reference or ran.exists():  # a finished run of this code: only its checks again
        output = (out.parent / f"{strategy}.log").read_text()
    else:
        shutil.rmtree(out, ignore_errors=True)  # a failed earlier attempt's files
        output = helpers.run(config, strategy, out, init=init)
        ran.write_text(json.dumps({"seconds": time.monotonic() - started}))
    row["fired"] = helpers.check_probes(config, strategy, out, output)
    if strategy != "single" and "fi" in config.probes and (workspace / config.slug / "single").exists():
        single = helpers.final_fi(workspace / config.slug / "single")
        for key, counts in helpers.final_fi(out).items():
            np.testing.assert_array_equal(counts, single[key], err_msg=f"f(i) {key}")
        row["checks"].append("f(i) = one process")
    if strategy == "fsdp" and "niah" in config.probes:
        worst = helpers.check_sharded_niah(config, strategy, out, init, workspace / config.slug / "niah")
        row["checks"].append(f"NIAH = one process (logits {worst:.0e})")
    if strategy == "fsdp" and name == "pretrain/tiny_512":
        shutil.rmtree(workspace / config.slug / "resumed", ignore_errors=True)
        _kill_and_resume(config, out, workspace / config.slug / "resumed")
        row["checks"].append("kill + resume = uninterrupted")
    row["seconds"] = json.loads(ran.read_text())["seconds"] if ran.exists() else time.monotonic() - started
    row["pass"] = True
    kept.write_text(json.dumps(row))


def _kill_and_resume(config, reference: Path, out: Path) -> None:
    """SIGKILL every rank after step 2's checkpoint, then `train.resume=auto`: the losses of
    steps 3 and 4 and the final f(i) are the uninterrupted run's."""
    helpers.kill_after_checkpoint(config, "fsdp", out, step=2)
    helpers.run(config, "fsdp", out, extra=["train.resume=auto"])
    expected = {r["step"]: r["train/loss"] for r in helpers.metrics(reference) if "train/loss" in r}
    got = {r["step"]: r["train/loss"] for r in helpers.metrics(out) if "train/loss" in r}
    assert {s: got[s] for s in (3, 4)} == {s: expected[s] for s in (3, 4)}
    for key, counts in helpers.final_fi(reference).items():
        np.testing.assert_array_equal(helpers.final_fi(out)[key], counts, err_msg=f"f(i) {key}")


def test_table_in_docs():
    """docs/composition.md's table, from this run, when every cell ran in it."""
    if len(RESULTS) < len(CELLS):
        pytest.skip(f"{len(RESULTS)} of {len(CELLS)} cells ran in this session; the table needs all")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=helpers.ROOT, capture_output=True, text=True)
    lines = [
        f"Generated by `make test-slow` (tests/composition/test_matrix.py) at commit {commit.stdout.strip() or '?'} "
        f"(code key {code_key()}, harness {code_key(HARNESS)}) "
        f"on {time.strftime('%Y-%m-%d')}, torch {torch.__version__}, {os.cpu_count()} CPU cores: "
        f"{sum(r['pass'] for r in RESULTS.values())} of {len(CELLS)} cells pass, "
        f"{sum(r['seconds'] for r in RESULTS.values()) / 60:.1f} minutes of cells.",
        "",
        "| configuration | command | strategy | probes fired (metrics.jsonl / W&B rows) | checks | pass | s |",
        "| --- | --- | --- | --- | --- | --- | ---: |",
    ]
    for name, strategy in CELLS:
        row, config = RESULTS[name, strategy], BY_NAME[name]
        fired = ", ".join(f"{probe} {local}/{remote}" for probe, (local, remote) in row["fired"].items())
        checks = "; ".join(row["checks"]) or "-"
        mark = "pass" if row["pass"] else "**FAIL**"
        lines.append(f"| {name} | {config.command} | {strategy} | {fired} | {checks} | {mark} | {row['seconds']:.0f} |")
    text = TABLE.read_text()
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    TABLE.write_text(f"{head}{BEGIN}\n" + "\n".join(lines) + f"\n{END}{tail}")
    assert all(row["pass"] for row in RESULTS.values())
