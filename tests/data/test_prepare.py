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
    assert main(["prepare", str(corpus), str(tmp_path / "out"), "--tokenizer", str(tokenizer_path)]) == 0

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
    with pytest.raises(ValueError, match="yielded no usable document"):
        prepare(str(corpus), tmp_path / "out", str(tokenizer_path), verbose=False)
