"""The effective-length search gives the recorded outputs: per test, the prompt's hash, the
decoded output, which answers it holds and whether it passed, for `longctx niah` on a small
trained checkpoint (rope and StRing) and for the in-training probe (`probe.niah_every_steps`)
of the short run that trains it. Records: tests/golden/niah_records.json, written by

    PYTHONPATH=src .venv/bin/python -m tests.eval.test_niah_records --update

A changed output or verdict is a changed decoder, prompt or scorer: the diff names the test.
"""

import hashlib
import json
import os
import sys
from pathlib import Path

import pytest

from longctx.cli import main
from tests.train.helpers import make_workspace, overrides

RECORDS_FILE = Path(__file__).parents[1] / "golden" / "niah_records.json"
SMOLLM2_RECORDS_FILE = Path(__file__).parents[1] / "golden" / "niah_smollm2_records.json"
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


def prompt_hash(ids) -> str:
    return hashlib.sha1(",".join(map(str, ids)).encode()).hexdigest()


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


class Searches:
    """Every test each effective-length search decoded, search by search, in order."""

    def __init__(self, monkeypatch):
        import longctx.niah.evaluation as evaluation
        import longctx.niah.search as search

        self.searches: list[list[dict]] = []
        found_answers, search_effective_length = search.found_answers, evaluation.search_effective_length

        def spy_found(sample, output):
            found = found_answers(sample, output)
            self.searches[-1].append(
                {
                    "length": sample.length,
                    "index": sample.index,
                    "prompt_hash": prompt_hash(sample.input_ids.tolist()),
                    "output": output,
                    "found": found,
                    "passed": sum(found) >= 2,
                }
            )
            return found

        def spy_search(*args, **kwargs):
            self.searches.append([])
            return search_effective_length(*args, **kwargs)

        monkeypatch.setattr(search, "found_answers", spy_found)
        monkeypatch.setattr(evaluation, "search_effective_length", spy_search)

    def take(self) -> list[list[dict]]:
        taken, self.searches = self.searches, []
        return taken


def record(root: Path, monkeypatch) -> dict:
    """Train the small checkpoint (its probe on), then `longctx niah` on it under each method."""
    workspace = make_workspace(root / "workspace")
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
    searches = Searches(monkeypatch)
    assert main(["pretrain", *args, *SEARCH, "log.wandb_mode=disabled"]) == 0
    records: dict = {"probe": {}, "niah": {}}
    for step, tests in zip((1, 2), searches.take(), strict=True):
        directory = run / "niah" / f"step-{step:07d}"
        records["probe"][str(step)] = {"summary": summary(directory / "niah.json"), "tests": tests}
    checkpoint = run / "checkpoints" / "last.ckpt"
    for name, extra in RUNS.items():
        out = root / f"niah-{name}"
        command = ["niah", str(checkpoint), f"data.tokenizer={workspace / 'tokenizer.json'}", *SEARCH, *extra]
        assert main([*command, "--out", str(out)]) == 0
        [tests] = searches.take()
        records["niah"][name] = {"summary": summary(out / "niah.json"), "tests": tests}
    return records


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    with pytest.MonkeyPatch.context() as monkeypatch:
        return record(tmp_path_factory.mktemp("niah-records"), monkeypatch)


def test_the_search_gives_the_recorded_outputs(recorded):
    expected = json.loads(RECORDS_FILE.read_text())
    for kind in ("probe", "niah"):
        for name, run in expected[kind].items():
            got = recorded[kind][name]
            assert len(got["tests"]) == len(run["tests"]) > 0, (kind, name)
            for want, have in zip(run["tests"], got["tests"], strict=True):
                assert have == want, f"{kind} {name}: test L={want['length']} #{want['index']} changed"
            assert got["summary"] == pytest.approx(run["summary"], nan_ok=True), (kind, name)


def record_smollm2(root: Path, monkeypatch) -> dict:
    """`longctx niah` on SmolLM2-135M-Instruct at 1K and 2K, 8 tests each (the bare prompt)."""
    searches = Searches(monkeypatch)
    out = root / "smollm2"
    command = ["niah", str(SMOLLM2), "--lengths", "1024,2048", "eval.niah.tests_per_length=8", *SEARCH]
    assert main([*command, "eval.niah.max_new_tokens=32", "eval.niah.prefill_chunk_tokens=2048", "--out", str(out)]) == 0
    [tests] = searches.take()
    return {"summary": summary(out / "niah.json"), "tests": tests}


@pytest.mark.slow
def test_smollm2_gives_the_recorded_outputs(tmp_path):
    if not (SMOLLM2 / "config.json").is_file():
        pytest.skip(f"no {SMOLLM2} (make real-model)")
    expected = json.loads(SMOLLM2_RECORDS_FILE.read_text())
    with pytest.MonkeyPatch.context() as monkeypatch:
        got = record_smollm2(tmp_path, monkeypatch)
    assert len(got["tests"]) == len(expected["tests"]) == 16
    for want, have in zip(expected["tests"], got["tests"], strict=True):
        assert have == want, f"SmolLM2: test L={want['length']} #{want['index']} changed"
    assert got["summary"] == pytest.approx(expected["summary"], nan_ok=True)


if __name__ == "__main__" and "--update" in sys.argv:
    import tempfile

    with tempfile.TemporaryDirectory() as scratch, pytest.MonkeyPatch.context() as patch:
        if "--smollm2" in sys.argv:
            SMOLLM2_RECORDS_FILE.write_text(json.dumps(record_smollm2(Path(scratch), patch), indent=1) + "\n")
            print(f"wrote {SMOLLM2_RECORDS_FILE}")
        else:
            RECORDS_FILE.write_text(json.dumps(record(Path(scratch), patch), indent=1) + "\n")
            print(f"wrote {RECORDS_FILE}")
