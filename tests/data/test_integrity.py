"""Prepared data carries its integrity (data/integrity.py, issue 37 item 2): chunk sizes
and checksums recorded by `prepare`, checked on open and by `prepare --verify`; damage
found while reading names the chunk. Checksums are recomputed here with hashlib."""

import hashlib
import itertools
import json
import shutil

import pytest

from longctx.cli import main
from longctx.data.corpus import embedded_documents
from longctx.data.packing import PackedSource
from longctx.data.prepare import MANIFEST_FILE, prepare
from longctx.data.tokenizer import train_bpe
from longctx.errors import DataIntegrityError


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    root = tmp_path_factory.mktemp("integrity")
    texts = [doc.text for doc in itertools.islice(embedded_documents(("prose",)), 30)]
    (root / "corpus.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    train_bpe(texts, vocab_size=300, path=root / "tokenizer.json")
    prepare(str(root / "corpus.jsonl"), root / "data", str(root / "tokenizer.json"), verbose=False, chunk_bytes="40KB")
    return root / "data"


@pytest.fixture
def copy(prepared, tmp_path):
    return shutil.copytree(prepared, tmp_path / "data")


def chunk_files(directory) -> list:
    return sorted(directory.glob("chunk-*.bin"))


def test_prepare_records_every_chunks_size_and_sha256(prepared):
    recorded = json.loads((prepared / MANIFEST_FILE).read_text())["chunks"]
    files = chunk_files(prepared)
    assert len(files) >= 3 and sorted(r["file"] for r in recorded) == [f.name for f in files]
    for record in recorded:
        data = (prepared / record["file"]).read_bytes()
        assert record["bytes"] == len(data) and record["sha256"] == hashlib.sha256(data).hexdigest()


def test_a_truncated_chunk_is_named_when_the_dataset_opens(copy):
    chunk = chunk_files(copy)[1]
    size = chunk.stat().st_size
    chunk.write_bytes(chunk.read_bytes()[: size // 2])
    with pytest.raises(DataIntegrityError) as caught:
        PackedSource(copy, seed=0)
    error = caught.value
    assert error.path == str(chunk) and (error.expected, error.found) == (size, size // 2)
    assert f"chunk is {size // 2:,} bytes, expected {size:,} (truncated)" in str(error)


def test_a_chunk_truncated_after_opening_is_named_when_read_not_a_litdata_timeout(copy):
    source = PackedSource(copy, seed=0, shuffle=False)
    chunk = chunk_files(copy)[0]
    size = chunk.stat().st_size
    chunk.write_bytes(chunk.read_bytes()[:100])
    with pytest.raises(DataIntegrityError, match=f"document 0 cannot be read: chunk is 100 bytes, expected {size:,}"):
        source.read(0, 10)


def test_a_corrupted_region_is_named_with_both_checksums(copy, prepared):
    chunk = chunk_files(copy)[0]
    data = bytearray(chunk.read_bytes())
    data[4:40] = b"\xff" * 36  # the chunk's item offsets: litdata cannot parse its items
    chunk.write_bytes(bytes(data))
    source = PackedSource(copy, seed=0, shuffle=False)  # same size: the cheap check passes
    with pytest.raises(DataIntegrityError) as caught:
        source.read(0, 10)
    expected = hashlib.sha256((prepared / chunk.name).read_bytes()).hexdigest()
    assert caught.value.path == str(chunk)
    assert (caught.value.expected, caught.value.found) == (expected, hashlib.sha256(data).hexdigest())
    assert "document 0 cannot be read: chunk checksum is sha256" in str(caught.value)


def test_verify_finds_altered_tokens_that_still_parse(copy, capsys):
    assert main(["prepare", "--verify", str(copy)]) == 0
    assert "sizes match, checksums match" in capsys.readouterr().out
    chunk = chunk_files(copy)[-1]
    data = bytearray(chunk.read_bytes())
    data[-8:] = bytes(8)  # the last document's last tokens: litdata reads them without complaint
    chunk.write_bytes(bytes(data))
    assert main(["prepare", "--verify", str(copy)]) == 2
    assert f"{chunk}: chunk checksum is sha256 {hashlib.sha256(data).hexdigest()}" in capsys.readouterr().err


def test_training_with_data_verify_full_refuses_altered_data(copy, prepared):
    """The sources training resolves (data/dataset_sources.py) are hashed with data.verify=full."""
    from longctx.config import load
    from longctx.data.dataset_sources import prepared_sources
    from longctx.data.tokenizer import load_tokenizer

    chunk = chunk_files(copy)[0]
    data = bytearray(chunk.read_bytes())
    data[-8:] = bytes(8)
    chunk.write_bytes(bytes(data))
    tokenizer_path = prepared.parent / "tokenizer.json"
    tokenizer = load_tokenizer(str(tokenizer_path))
    args = [f"data.path={copy}", f"data.tokenizer={tokenizer_path}"]
    assert prepared_sources(load([], args), tokenizer) == [(str(copy), 1.0)]  # data.verify=sizes: same size
    with pytest.raises(DataIntegrityError, match=f"{chunk}: chunk checksum is sha256"):
        prepared_sources(load([], [*args, "data.verify=full"]), tokenizer)


def test_a_dataset_prepared_before_checksums_opens_and_checks_sizes_from_litdatas_index(copy, capsys):
    manifest = json.loads((copy / MANIFEST_FILE).read_text())
    del manifest["chunks"]
    (copy / MANIFEST_FILE).write_text(json.dumps(manifest))
    assert PackedSource(copy, seed=0).read(0, 100).numel() == 100
    assert main(["prepare", "--verify", str(copy)]) == 0
    assert "have no recorded checksum" in capsys.readouterr().out
    chunk = chunk_files(copy)[0]
    size = chunk.stat().st_size
    chunk.write_bytes(chunk.read_bytes() + b"extra")
    with pytest.raises(DataIntegrityError, match=f"chunk is {size + 5:,} bytes, expected {size:,} \\(extended\\)"):
        PackedSource(copy, seed=0)
