"""eval/cells.py: a grid of cells written as they finish, skipped by a rerun, resumed after a
kill with the same samples, refused when the settings or the prompts changed."""

import json

import pytest

from longctx.eval import cell_decoding
from longctx.eval.cell_records import CellMismatchError, read_records
from longctx.eval.cells import Decoding, run_grid
from tests.eval.helpers import CopyTask, KillAfter, Tokens, copy_grid, copy_model


@pytest.fixture(scope="module")
def model():
    return copy_model()


def grid(model, count=5, task=None, lengths=(24, 40)):
    return copy_grid(model, count, task, lengths)

    def cell_done(self, result, reused):
        pass


def _strip(records):
    return [{k: v for k, v in r.items() if k != "seconds"} for r in records]


def test_cells_are_written_reused_and_resumed_with_the_same_samples(model, tmp_path, monkeypatch):
    decoding = Decoding(batch_tokens=48)  # 2 rows of <= 24 tokens, 1 row of 40: several batches per cell
    clean = run_grid(grid(model), Tokens(), tmp_path / "clean", decoding)
    assert [r.cell.name for r in clean] == [
        "m rope copy L=24",
        "m rope copy L=40",
        "m string copy L=24",
        "m string copy L=40",
    ]
    for result in clean:
        directory = result.cell.directory(tmp_path / "clean")
        assert [r["index"] for r in read_records(directory / "samples.jsonl")] == list(range(5))
        summary = json.loads((directory / "summary.json").read_text())
        assert summary["count"] == 5 and summary["score"] == sum(r["score"] for r in result.records) / 5
        assert json.loads((directory / "cell.json").read_text())["method_settings"]["name"] == result.cell.method
    # StRing reaches the model: beyond its shift (L/3 of 32) the outputs differ from RoPE's.
    assert clean[1].records != clean[3].records

    # A killed run: the third batch raises; the first cell is done, the second half-written.
    with pytest.raises(RuntimeError, match="killed"):
        run_grid(grid(model), Tokens(), tmp_path / "killed", decoding, progress=KillAfter(4))
    first, second = (c.directory(tmp_path / "killed") for c in (clean[0].cell, clean[1].cell))
    assert (first / "summary.json").exists() and not (second / "summary.json").exists()
    assert len(read_records(second / "samples.jsonl")) == 1
    with (second / "samples.jsonl").open("a") as torn:
        torn.write('{"index": 4, "prom')  # killed inside a write
    decoded = []
    generate = cell_decoding.generate

    def counting(model, prompts, **options):
        decoded.extend(prompts)
        return generate(model, prompts, **options)

    monkeypatch.setattr(cell_decoding, "generate", counting)
    resumed = run_grid(grid(model), Tokens(), tmp_path / "killed", decoding)
    assert len(decoded) == 4 + 5 + 5  # the second cell's 4 missing samples, then the two string cells
    assert [_strip(r.records) for r in resumed] == [_strip(r.records) for r in clean]

    decoded.clear()
    again = run_grid(grid(model), Tokens(), tmp_path / "killed", decoding)
    assert decoded == [] and [r.summary for r in again] == [r.summary for r in resumed]
    # More samples extend the cells, fewer reuse the first records. Sample 5 joins sample 4's
    # batch (rows of 2 at L=24), which is decoded whole: 2 + 1 + 2 + 1 prompts, 4 new records.
    more = run_grid(grid(model, count=6), Tokens(), tmp_path / "killed", decoding)
    assert len(decoded) == 6 and [len(r.records) for r in more] == [6] * 4
    assert [r.decoded for r in more] == [1] * 4
    fewer = run_grid(grid(model, count=2), Tokens(), tmp_path / "killed", decoding)
    assert [r.summary["count"] for r in fewer] == [2] * 4
    assert _strip(fewer[0].records) == _strip(clean[0].records[:2])


def test_cells_with_other_settings_or_prompts_are_refused(model, tmp_path):
    decoding = Decoding()
    run_grid(grid(model, count=2, lengths=[24]), Tokens(), tmp_path, decoding)
    other_seed = grid(model, count=2, lengths=[24])
    other_seed.seed = 4
    with pytest.raises(CellMismatchError, match="seed differ"):
        run_grid(other_seed, Tokens(), tmp_path, decoding)
    cell = grid(model, count=2, lengths=[24]).cells()[0][0]
    (cell.directory(tmp_path) / "summary.json").unlink()

    class OtherPrompts(CopyTask):
        def settings(self):
            return {}  # claims the same settings, draws other prompts

    with pytest.raises(CellMismatchError, match="sample 0 was decoded from another prompt"):
        run_grid(grid(model, count=2, lengths=[24], task=OtherPrompts(salt=1)), Tokens(), tmp_path, decoding)
