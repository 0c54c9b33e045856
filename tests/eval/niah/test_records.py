"""The effective-length search gives the recorded outputs: per test, the prompt's hash, the
decoded output, which answers it holds and whether it passed, for `longctx niah` on a small
trained checkpoint (rope and StRing) and for the in-training probe (`probe.niah_every_steps`)
of the short run that trains it. Records: tests/golden/niah_records.json, written by

    PYTHONPATH=src .venv/bin/python -m tests.eval.niah.test_records --update

A changed output or verdict is a changed decoder, prompt or scorer: the diff names the test.
"""

import json
import os
import sys
from pathlib import Path

import pytest

from longctx.cli import main
from longctx.gpu_checks import prepared_workspace
from tests.train.helpers import overrides

RECORDS_FILE = Path(__file__).parents[2] / "golden" / "niah_records.json"
SMOLLM2_RECORDS_FILE = Path(__file__).parents[2] / "golden" / "niah_smollm2_records.json"
SMOLLM2 = Path(os.environ.get("LONGCTX_CACHE", Path.home() / ".cache" / "longctx")) / "hf" / "smollm2-135m-instruct"
"""`make real-model`'s directory (`longctx convert-gguf smollm2 DIR`)."""
SEARCH = [
    "eval.niah.step=128",
    "eval.niah.max_new_tokens=12",
    "eval.niah.stop_at_first_failure=false",
    "log.wandb_mode=disabled",
]
RUNS = {
    "rope": ["eval.niah.tests_per_length=3", "eval.niah.max_length=512"],
    "string": [
        "eval.niah.tests_per_length=3",
        "eval.niah.max_length=512",
        "eval.position_method.name=string",
        "eval.position_method.string.shift_ratio=0.33",
        "eval.position_method.string.local_window=32",
    ],
}


def summary(niah_json: Path) -> dict:
    """What a niah.json reports, less its wall times."""
    data = json.loads(niah_json.read_text())
    rows = [{k: v for k, v in row.items() if k != "seconds"} for row in data["per_length"]]
    return {
        "effective_length": data["effective_length"],
        "per_length": rows,
        "skipped_lengths": data["skipped_lengths"],
        "depth_recall": data["depth_recall"],
        "heatmap": data["heatmap"],
    }


def decoded_tests(cells: Path) -> list[dict]:
    """Every test a search decoded: the records of its cells under `cells`, length by length."""
    rows = []
    for path in sorted(cells.glob("**/samples.jsonl"), key=lambda p: int(p.parent.name[1:])):
        records = sorted((json.loads(line) for line in path.read_text().splitlines()), key=lambda r: r["index"])
        rows += [
            {
                "length": int(path.parent.name[1:]),
                "index": record["index"],
                "prompt_hash": record["prompt_hash"],
                "output": record["text"],
                "found": record["found"],
                "passed": record["score"] == 1.0,
            }
            for record in records
        ]
    return rows


def record(root: Path) -> dict:
    """Train the small checkpoint (its probe on), then `longctx niah` on it under each method."""
    workspace = prepared_workspace(root / "workspace")
    run = root / "run"
    args = overrides(
        workspace,
        run,
        **{
            "train.max_steps": 2,
            "model.max_position": 256,
            "data.window": 256,
            "probe.fi": "false",
            "probe.niah_every_steps": 1,
            "probe.niah_tests_per_length": 2,
            "train.checkpoint_every_steps": 2,
            "train.lr": 5e-4,
            "train.min_lr": 5e-5,
        },
    )
    assert main(["pretrain", *args, *SEARCH, "log.wandb_mode=disabled"]) == 0
    records: dict = {"probe": {}, "niah": {}}
    for step in (1, 2):
        directory = run / "niah" / f"step-{step:07d}"
        tests = decoded_tests(directory / "cells")
        records["probe"][str(step)] = {"summary": summary(directory / "niah.json"), "tests": tests}
    checkpoint = run / "checkpoints" / "last.ckpt"
    for name, extra in RUNS.items():
        out = root / f"niah-{name}"
        command = ["niah", str(checkpoint), f"data.tokenizer={workspace / 'tokenizer.json'}", *SEARCH, *extra]
        assert main([*command, "--out", str(out)]) == 0
        records["niah"][name] = {"summary": summary(out / "niah.json"), "tests": decoded_tests(out / "cells")}
    return records


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    return record(tmp_path_factory.mktemp("niah-records"))


def test_the_search_gives_the_recorded_outputs(recorded):
    expected = json.loads(RECORDS_FILE.read_text())
    for kind in ("probe", "niah"):
        for name, run in expected[kind].items():
            got = recorded[kind][name]
            assert len(got["tests"]) == len(run["tests"]) > 0, (kind, name)
            for want, have in zip(run["tests"], got["tests"], strict=True):
                assert have == want, f"{kind} {name}: test L={want['length']} #{want['index']} changed"
            assert got["summary"] == run["summary"], (kind, name)


def record_smollm2(root: Path) -> dict:
    """`longctx niah` on SmolLM2-135M-Instruct at 1K and 2K, 8 tests each (the bare prompt)."""
    out = root / "smollm2"
    command = ["niah", str(SMOLLM2), "--lengths", "1024,2048", "eval.niah.tests_per_length=8", *SEARCH]
    assert (
        main([*command, "eval.niah.max_new_tokens=32", "eval.niah.prefill_chunk_tokens=2048", "--out", str(out)]) == 0
    )
    return {"summary": summary(out / "niah.json"), "tests": decoded_tests(out / "cells")}


@pytest.mark.slow
def test_smollm2_gives_the_recorded_outputs(tmp_path):
    if not (SMOLLM2 / "config.json").is_file():
        pytest.skip(f"no {SMOLLM2} (make real-model)")
    expected = json.loads(SMOLLM2_RECORDS_FILE.read_text())
    got = record_smollm2(tmp_path)
    assert len(got["tests"]) == len(expected["tests"]) == 16
    for want, have in zip(expected["tests"], got["tests"], strict=True):
        assert have == want, f"SmolLM2: test L={want['length']} #{want['index']} changed"
    assert got["summary"] == expected["summary"]


if __name__ == "__main__" and "--update" in sys.argv:
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        if "--smollm2" in sys.argv:
            SMOLLM2_RECORDS_FILE.write_text(json.dumps(record_smollm2(Path(scratch)), indent=1) + "\n")
            print(f"wrote {SMOLLM2_RECORDS_FILE}")
        else:
            RECORDS_FILE.write_text(json.dumps(record(Path(scratch)), indent=1) + "\n")
            print(f"wrote {RECORDS_FILE}")
