"""`longctx prepare`: token counts, rejected items in the manifest, idempotent re-runs."""

import itertools
import json

import numpy as np
import pytest
from litdata import StreamingDataset

from longctx.cli import main
from longctx.data.corpus import embedded_documents
from longctx.data.packing import LENGTHS_FILE
from longctx.data.prepare import MANIFEST_FILE, check_dataset, prepare
from longctx.data.tokenizer import load_tokenizer, train_bpe


@pytest.fixture(scope="module")
def tokenizer_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    texts = [doc.text for doc in itertools.islice(embedded_documents(("prose",)), 40)]
    train_bpe(texts, vocab_size=300, path=path)
    return path


def test_prepare_tokenises_every_good_document_and_reports_the_rest(tmp_path, tokenizer_path):
    good = ["first document", "second one, a little longer", "third: 123456"]
    lines = [
        json.dumps({"text": good[0]}),
        "{not json",
        json.dumps({"text": good[1]}),
        json.dumps({"text": ""}),
        json.dumps({"body": "no text key"}),
        json.dumps({"text": good[2]}),
    ]
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("\n".join(lines) + "\n")
    out = ["prepare", str(corpus), str(tmp_path / "out"), "--tokenizer", str(tokenizer_path)]
    assert main(out) == 2  # bad input stops the run unless a skip policy is given
    assert main([*out, "--on-bad-input", "skip"]) == 0

    manifest = json.loads((tmp_path / "out" / MANIFEST_FILE).read_text())
    tokenizer = load_tokenizer(str(tokenizer_path))
    expected = sorted([*tokenizer.encode(text), tokenizer.eos_id] for text in good)
    dataset = StreamingDataset(str(tmp_path / "out"), shuffle=False)
    items = [dataset[i].tolist() for i in range(len(dataset))]
    assert sorted(items) == expected
    assert np.load(tmp_path / "out" / LENGTHS_FILE).tolist() == [len(item) for item in items]
    assert manifest["documents"] == 3 and manifest["tokens"] == sum(map(len, expected))
    assert manifest["rejected"] == {"bad-json": 1, "empty": 1, "missing-key": 1}
    assert {item["where"] for item in manifest["rejected_items"]} == {f"{corpus}:2", f"{corpus}:4", f"{corpus}:5"}
    assert manifest["tokenizer_fingerprint"] == tokenizer.fingerprint


def test_completed_prepare_is_not_redone(tmp_path, tokenizer_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(json.dumps({"text": "hello world"}) + "\n")
    prepare(str(corpus), tmp_path / "out", str(tokenizer_path), verbose=False)
    stamp = (tmp_path / "out" / MANIFEST_FILE).stat().st_mtime_ns
    corpus.write_text("")  # would fail if it were read again
    prepare(str(corpus), tmp_path / "out", str(tokenizer_path), verbose=False)
    assert (tmp_path / "out" / MANIFEST_FILE).stat().st_mtime_ns == stamp


def test_dataset_from_another_tokenizer_is_refused(tmp_path, tokenizer_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(json.dumps({"text": "hello world"}) + "\n")
    prepare(str(corpus), tmp_path / "out", str(tokenizer_path), verbose=False)
    other = tmp_path / "other.json"
    train_bpe(["completely different text " * 50], vocab_size=270, path=other)
    with pytest.raises(ValueError, match="was tokenised with"):
        check_dataset(tmp_path / "out", load_tokenizer(str(other)))


def test_source_without_usable_documents(tmp_path, tokenizer_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(json.dumps({"text": "   "}) + "\n")
    with pytest.raises(ValueError, match=r"c\.jsonl:1: empty text"):
        prepare(str(corpus), tmp_path / "out", str(tokenizer_path), verbose=False)
    with pytest.raises(ValueError, match="yielded no usable document"):
        prepare(str(corpus), tmp_path / "out", str(tokenizer_path), verbose=False, on_bad_input="skip")


def _prepare_slowly(directory, log_path):
    """A stand-in for prepare_retrieval: logs its start and end, takes 0.5 s, writes a complete
    manifest and the answer spans."""
    import json
    import time
    from pathlib import Path

    from longctx.data.answer_spans import ANSWERS_FILE
    from longctx.data.prepare import MANIFEST_FILE

    with open(log_path, "a") as log:
        log.write(f"start {time.monotonic()}\n")
    time.sleep(0.5)
    Path(directory).mkdir(parents=True, exist_ok=True)
    (Path(directory) / MANIFEST_FILE).write_text(json.dumps({"complete": True}))
    (Path(directory) / ANSWERS_FILE).write_bytes(b"")
    with open(log_path, "a") as log:
        log.write(f"end {time.monotonic()}\n")


def test_concurrent_launches_prepare_a_retrieval_source_once(tmp_path, monkeypatch):
    """Two processes asking for the same generated source: one prepares, the other waits
    for it (a file lock) and finds it complete, so nobody reads a half-written dataset."""
    import multiprocessing

    from longctx.config import DataSource
    from longctx.data import dataset_sources

    log_path = tmp_path / "log.txt"
    monkeypatch.setattr(
        dataset_sources, "prepare_retrieval", lambda source, directory, *args: _prepare_slowly(directory, log_path)
    )
    directory = tmp_path / "retrieval-x"
    context = multiprocessing.get_context("fork")
    workers = [
        context.Process(
            target=dataset_sources._prepare_once, args=(directory, None, "bpe-512", DataSource(kind="retrieval"))
        )
        for _ in range(2)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=30)
    assert [worker.exitcode for worker in workers] == [0, 0]
    events = log_path.read_text().split()
    assert events[0::2] == ["start", "end"], f"prepared more than once: {events}"


def test_prepare_under_torchrun_writes_every_document_length(tmp_path, tokenizer_path, monkeypatch):
    """Local rank 0 prepares while torchrun's WORLD_SIZE is set (no process group yet): litdata
    then hands each rank a share of the items, and the lengths table must still list all."""
    texts = [doc.text for doc in itertools.islice(embedded_documents(("prose",)), 9)]
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": text}) + "\n" for text in texts))
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "0")
    manifest = prepare(str(corpus), tmp_path / "out", str(tokenizer_path), verbose=False)
    tokenizer = load_tokenizer(str(tokenizer_path))
    expected = [len(tokenizer.encode(text)) + 1 for text in texts]  # each document ends with EOS
    lengths = np.load(tmp_path / "out" / LENGTHS_FILE)
    assert manifest["documents"] == len(texts)
    assert lengths.tolist() == expected
