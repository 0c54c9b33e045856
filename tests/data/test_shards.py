"""`longctx prepare` over sharded corpora: every format read back with exact token counts
(and read alike by `longctx fi`), the metadata filter, two nodes' parts joined, a killed run
resumed, each bad input."""

import gzip
import hashlib
import itertools
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from litdata import StreamingDataset

from longctx.cli import main
from longctx.data import sharded_prepare
from longctx.data.corpus import embedded_documents
from longctx.data.packing import LENGTHS_FILE
from longctx.data.prepare import MANIFEST_FILE, check_dataset
from longctx.data.shard_reader import (
    EXAMPLES_KEPT,
    SHARD_READERS,
    SHARD_SUFFIXES,
    CorpusReport,
    MetadataFilter,
    ShardError,
    find_shards,
    shard_texts,
)
from longctx.data.tokenizer import load_tokenizer, train_bpe
from longctx.errors import DataError

# Not on the GPU image: this module skips there instead of failing to collect.
zstandard = pytest.importorskip("zstandard", reason="zstandard is not installed (the `corpora` extra has it)")

SETS = ("RedPajamaC4", "RedPajamaGithub", "RedPajamaWikipedia")


@pytest.fixture(scope="module")
def tokenizer_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    train_bpe([doc.text for doc in itertools.islice(embedded_documents(("prose",)), 40)], vocab_size=300, path=path)
    return str(path)


def records(shard: int, count: int) -> list[dict]:
    """SlimPajama-format records with distinct texts of varied length."""
    rng = np.random.default_rng(shard)
    words = ["alpha", "beta", "gamma", "delta", "shard", "token", "window", "position"]
    return [
        {
            "text": f"shard {shard} doc {i}: " + " ".join(rng.choice(words, int(rng.integers(1, 40)))),
            "meta": {"redpajama_set_name": SETS[(shard + i) % 3]},
        }
        for i in range(count)
    ]


def jsonl_bytes(rows: list[dict]) -> bytes:
    return "".join(json.dumps(row) + "\n" for row in rows).encode()


SHARD_WRITERS = {
    ".jsonl": lambda path, rows: path.write_bytes(jsonl_bytes(rows)),
    ".jsonl.zst": lambda path, rows: path.write_bytes(zstandard.ZstdCompressor().compress(jsonl_bytes(rows))),
    ".jsonl.gz": lambda path, rows: path.write_bytes(gzip.compress(jsonl_bytes(rows))),
    ".parquet": lambda path, rows: pq.write_table(pa.Table.from_pylist(rows), path),
}
"""How each format of shard_reader.SHARD_READERS is written: the tests over every format use it."""

RECORD_PLACE = {".parquet": "row {row}"}
"""Where a format's reader says a record is, beside the file, when it is not the line (row + 1)."""


def write_shard(path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    [suffix] = [suffix for suffix in SHARD_WRITERS if path.name.endswith(suffix)]
    SHARD_WRITERS[suffix](path, rows)


def record_place(shard, row: int) -> str:
    """Where the reader names record `row` (0-based) of `shard`: file:line or file:row N."""
    [suffix] = [suffix for suffix in SHARD_WRITERS if shard.name.endswith(suffix)]
    return f"{shard}:" + RECORD_PLACE.get(suffix, "{line}").format(row=row, line=row + 1)


def test_every_format_the_reader_knows_has_a_writer_here():
    assert sorted(SHARD_WRITERS) == sorted(SHARD_READERS) == sorted(SHARD_SUFFIXES)


@pytest.fixture
def corpus(tmp_path):
    """Six shards of the four formats in nested directories (and a stray file to ignore)."""
    root = tmp_path / "corpus"
    names = [
        "chunk1/example_train_0.jsonl.zst",
        "chunk1/example_train_1.jsonl.zst",
        "chunk2/example_train_0.jsonl.gz",
        "chunk2/sub/part-0.parquet",
        "chunk3/plain.jsonl",
        "chunk3/part-1.parquet",
    ]
    shards = {}
    for number, name in enumerate(names):
        shards[name] = records(number, 15 + 3 * number)
        write_shard(root / name, shards[name])
    (root / "chunk1" / "README.md").write_text("not a shard")
    return root, shards


def read_items(directory) -> list[list[int]]:
    dataset = StreamingDataset(str(directory), shuffle=False)
    return [dataset[i].tolist() for i in range(len(dataset))]


def expected_items(tokenizer, rows) -> list[list[int]]:
    return sorted([*tokenizer.encode(row["text"]), tokenizer.eos_id] for row in rows)


def test_shards_are_found_recursively_in_a_stable_order(corpus):
    root, shards = corpus
    assert [s.name for s in find_shards([str(root)])] == sorted(shards)
    by_glob = find_shards([str(root / "**" / "*.parquet"), str(root / "chunk3")])
    assert [s.name for s in by_glob] == ["chunk2/sub/part-0.parquet", "chunk3/part-1.parquet", "plain.jsonl"]
    with pytest.raises(ShardError, match="holds no file ending"):
        find_shards([str(root / "*.txt")])
    write_shard(root / "other" / "example_train_1.jsonl.zst", records(9, 2))
    both = find_shards([str(root / "chunk1"), str(root / "other"), str(root / "chunk1")])
    assert [s.name for s in both] == [
        "example_train_0.jsonl.zst",
        str(root / "chunk1" / "example_train_1.jsonl.zst"),  # the same relative name in two SRCs: the path
        str(root / "other" / "example_train_1.jsonl.zst"),
    ]


def test_every_format_is_prepared_with_exact_token_counts(tmp_path, corpus, tokenizer_path, capsys):
    root, shards = corpus
    out = tmp_path / "out"
    assert main(["prepare", str(root), str(out), "--tokenizer", tokenizer_path, "--workers", "2"]) == 0
    progress = [line for line in capsys.readouterr().out.splitlines() if "shards," in line]
    assert [line.split()[1] for line in progress] == ["2/6", "4/6", "6/6"]
    assert all("tokens/s" in line and "left" in line for line in progress)
    tokenizer = load_tokenizer(tokenizer_path)
    items = read_items(out)
    assert sorted(items) == expected_items(tokenizer, [row for rows in shards.values() for row in rows])
    assert np.load(out / LENGTHS_FILE).tolist() == [len(item) for item in items]
    manifest = check_dataset(out, tokenizer)
    assert manifest["documents"] == len(items) and manifest["tokens"] == sum(map(len, items))
    assert [record["name"] for record in manifest["shards"]] == sorted(shards)
    for record in manifest["shards"]:
        path = root / record["name"]
        assert record["bytes"] == path.stat().st_size
        assert record["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
        assert record["documents"] == len(shards[record["name"]])
        assert record["tokens"] == sum(map(len, expected_items(tokenizer, shards[record["name"]])))
    assert manifest["rejected"] == {} and manifest["filtered"] == 0


def test_metadata_filter_keeps_or_drops_a_set(tmp_path, corpus, tokenizer_path):
    root, shards = corpus
    tokenizer = load_tokenizer(tokenizer_path)
    rows = [row for rows in shards.values() for row in rows]
    args = ["--tokenizer", tokenizer_path, "--drop", "meta.redpajama_set_name=RedPajamaGithub"]
    assert main(["prepare", str(root), str(tmp_path / "drop"), *args]) == 0
    kept = [row for row in rows if row["meta"]["redpajama_set_name"] != "RedPajamaGithub"]
    assert sorted(read_items(tmp_path / "drop")) == expected_items(tokenizer, kept)
    assert json.loads((tmp_path / "drop" / MANIFEST_FILE).read_text())["filtered"] == len(rows) - len(kept)
    only = MetadataFilter.parse("meta.redpajama_set_name=RedPajamaC4,RedPajamaWikipedia", keep=True)
    texts = [text for name in sorted(shards) for text in shard_texts(str(root / name), keep=only)]
    assert texts == [row["text"] for name in sorted(shards) for row in shards[name] if row in kept]


def test_two_nodes_prepare_disjoint_parts_that_join_into_the_whole(tmp_path, corpus, tokenizer_path):
    root, shards = corpus
    out = tmp_path / "out"
    tokenizer = load_tokenizer(tokenizer_path)
    node = ["prepare", str(root), str(out), "--tokenizer", tokenizer_path, "--nodes", "2"]
    assert main([*node, "--node-rank", "0"]) == 0
    with pytest.raises(DataError, match="node 1 of 2's part is missing"):
        sharded_prepare.join_parts(out, 2, verbose=False)
    assert main([*node, "--node-rank", "1"]) == 0
    assert not (out / MANIFEST_FILE).exists()
    parts = [json.loads((out / "parts" / f"node-{k}-of-2" / "part.json").read_text()) for k in range(2)]
    names = [sorted(n for entry in part["rounds"] for n in entry["shards"]) for part in parts]
    assert names == [sorted(sorted(shards)[0::2]), sorted(sorted(shards)[1::2])]
    assert main(["prepare", "--join", str(out), "--nodes", "2"]) == 0
    rows = [row for rows in shards.values() for row in rows]
    assert sorted(read_items(out)) == expected_items(tokenizer, rows)
    manifest = check_dataset(out, tokenizer)
    assert sorted(record["name"] for record in manifest["shards"]) == sorted(shards)
    assert main(["prepare", "--verify", str(out)]) == 0  # the renamed chunks keep their recorded checksums


def test_a_killed_preparation_resumes_without_redoing_finished_shards(tmp_path, corpus, tokenizer_path, monkeypatch):
    root, shards = corpus
    out = tmp_path / "out"
    real_round = sharded_prepare._run_round
    calls = []

    def killed_in_third_round(directory, group, *args):
        calls.append([s.name for s in group])
        if len(calls) == 3:  # chunks written, ledger not yet: as if killed mid-round
            real_round(directory, group, *args)
            raise KeyboardInterrupt
        return real_round(directory, group, *args)

    monkeypatch.setattr(sharded_prepare, "_run_round", killed_in_third_round)
    with pytest.raises(KeyboardInterrupt):
        sharded_prepare.prepare_shards([str(root)], out, tokenizer_path, num_workers=2, verbose=False)
    done = [name for call in calls[:2] for name in call]
    calls.clear()
    monkeypatch.setattr(
        sharded_prepare,
        "_run_round",
        lambda directory, group, *args: calls.append([s.name for s in group]) or real_round(directory, group, *args),
    )
    sharded_prepare.prepare_shards([str(root)], out, tokenizer_path, num_workers=2, verbose=False)
    assert [name for call in calls for name in call] == [name for name in sorted(shards) if name not in done]
    tokenizer = load_tokenizer(tokenizer_path)
    assert sorted(read_items(out)) == expected_items(tokenizer, [row for rows in shards.values() for row in rows])


def test_a_part_started_with_other_settings_is_not_continued(tmp_path, corpus, tokenizer_path):
    root, shards = corpus
    out = tmp_path / "out"
    node = ["prepare", str(root), str(out), "--tokenizer", tokenizer_path, "--nodes", "2", "--node-rank", "0"]
    assert main(node) == 0
    with pytest.raises(DataError, match="was started with other settings \\(text_key differ\\)"):
        sharded_prepare.prepare_shards([str(root)], out, tokenizer_path, text_key="body", nodes=2, verbose=False)
    assert main([*node[:-4], "--nodes", "2", "--node-rank", "1"]) == 0
    ledger_path = out / "parts" / "node-1-of-2" / "part.json"
    ledger = json.loads(ledger_path.read_text())
    ledger["rounds"][-1]["shards"].append(sorted(shards)[0])  # node 0's shard, claimed twice
    ledger_path.write_text(json.dumps(ledger))
    with pytest.raises(DataError, match="do not cover the 6 shards exactly once"):
        sharded_prepare.join_parts(out, 2, verbose=False)


@pytest.mark.parametrize("suffix", SHARD_SUFFIXES)
def test_prepare_and_fi_read_every_format_alike(tmp_path, suffix, tokenizer_path, capsys):
    """One reader and one bad-input policy: `prepare` and `fi` of a shard with an empty record
    both stop naming its place; with `--on-bad-input skip` both skip it, count it and say where
    it was, and they count the same tokens."""
    rows = records(0, 6)
    rows[2] = {**rows[2], "text": "   "}
    shard = tmp_path / f"shard{suffix}"
    write_shard(shard, rows)
    place = record_place(shard, 2)
    prepare = ["prepare", str(shard), str(tmp_path / "data"), "--tokenizer", tokenizer_path]
    fi = ["fi", str(shard), "--window", "16", "--tokenizer", tokenizer_path, "--out", str(tmp_path / "fi")]
    for command in (prepare, fi):
        assert main(command) == 2
        assert f"{place}: empty text" in capsys.readouterr().err
    assert not (tmp_path / "data" / MANIFEST_FILE).exists() and not (tmp_path / "fi").exists()

    assert main([*prepare, "--on-bad-input", "skip"]) == 0
    manifest = json.loads((tmp_path / "data" / MANIFEST_FILE).read_text())
    assert manifest["rejected"] == {"empty": 1} and [item["where"] for item in manifest["rejected_items"]] == [place]
    tokenizer = load_tokenizer(tokenizer_path)
    good = [row for number, row in enumerate(rows) if number != 2]
    assert sorted(read_items(tmp_path / "data")) == expected_items(tokenizer, good)
    capsys.readouterr()
    assert main([*fi, "--on-bad-input", "skip"]) == 0
    printed = capsys.readouterr().out
    assert "rejected: 1 (1 empty)" in printed and f"{place}: empty text" in printed
    assert json.loads((tmp_path / "fi" / "fi_L16.json").read_text())["tokens"] == manifest["tokens"]


BAD_LINES = {
    "bad-json": (b"{not json\n", "bad JSON"),
    "missing-key": (b'{"body": "no text key"}\n', "no 'text' key"),
    "not-utf8": (b'{"text": "caf\xe9"}\n', "not UTF-8"),
    "empty": (b'{"text": "  "}\n', "empty text"),
}


@pytest.mark.parametrize("kind", sorted(BAD_LINES))
def test_a_bad_line_is_named_or_skipped_and_counted(tmp_path, kind):
    line, message = BAD_LINES[kind]
    shard = tmp_path / "s.jsonl"
    shard.write_bytes(jsonl_bytes(records(0, 2)) + line + jsonl_bytes(records(1, 1)))
    with pytest.raises(ShardError, match=f"{shard}:3: {message}"):
        list(shard_texts(str(shard)))
    counts = CorpusReport(examples_kept=EXAMPLES_KEPT)
    assert len(list(shard_texts(str(shard), on_bad_input="skip", counts=counts))) == 3
    assert counts.rejected == {kind: 1} and counts.rejections[0].where == f"{shard}:3"


def _truncated(path, rows, fraction=0.6):
    write_shard(path, rows)
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * fraction)])


@pytest.mark.parametrize("suffix", [".jsonl.zst", ".jsonl.gz"])
def test_a_truncated_or_corrupt_stream_is_named(tmp_path, suffix):
    shard = tmp_path / f"s{suffix}"
    _truncated(shard, records(0, 400))
    with pytest.raises(ShardError, match=rf"{shard}:\d+: corrupt or truncated"):
        list(shard_texts(str(shard)))
    counts = CorpusReport(examples_kept=EXAMPLES_KEPT)
    texts = list(shard_texts(str(shard), on_bad_input="skip", counts=counts))
    assert len(texts) < 400 and counts.rejected == {"corrupt-stream": 1}
    garbage = tmp_path / f"g{suffix}"
    garbage.write_bytes(b"\x00garbage, not a compressed stream" * 10)
    with pytest.raises(ShardError, match=f"{garbage}:1: corrupt or truncated"):
        list(shard_texts(str(garbage)))


@pytest.mark.parametrize("suffix", SHARD_SUFFIXES)
def test_an_empty_shard_is_an_error(tmp_path, suffix):
    shard = tmp_path / f"empty{suffix}"
    if suffix == ".parquet":
        pq.write_table(pa.table({"text": pa.array([], pa.string())}), shard)
    else:
        write_shard(shard, [])
    with pytest.raises(ShardError, match="empty shard"):
        list(shard_texts(str(shard)))
    counts = CorpusReport(examples_kept=EXAMPLES_KEPT)
    assert list(shard_texts(str(shard), on_bad_input="skip", counts=counts)) == []
    assert counts.rejected == {"empty-shard": 1}


def test_prepare_stops_on_bad_input_or_counts_it_in_the_manifest(tmp_path, tokenizer_path, capsys):
    root = tmp_path / "corpus"
    write_shard(root / "a.jsonl.zst", records(0, 30))
    _truncated(root / "b.jsonl.gz", records(1, 400))
    (root / "c.jsonl").write_bytes(jsonl_bytes(records(2, 3)) + b"{not json\n")
    assert main(["prepare", str(root), str(tmp_path / "out"), "--tokenizer", tokenizer_path]) == 2
    assert f"{root / 'b.jsonl.gz'}:" in capsys.readouterr().err
    assert not (tmp_path / "out" / MANIFEST_FILE).exists()  # never a silent partial dataset
    args = ["--tokenizer", tokenizer_path, "--on-bad-input", "skip", "--workers", "2"]
    assert main(["prepare", str(root), str(tmp_path / "skip"), *args]) == 0
    manifest = json.loads((tmp_path / "skip" / MANIFEST_FILE).read_text())
    assert manifest["rejected"] == {"corrupt-stream": 1, "bad-json": 1}
    assert {item["where"] for item in manifest["rejected_items"]} >= {f"{root / 'c.jsonl'}:4"}
    by_name = {record["name"]: record for record in manifest["shards"]}
    assert by_name["c.jsonl"]["skipped"] == {"bad-json": 1} and by_name["c.jsonl"]["documents"] == 3
    assert manifest["documents"] == sum(record["documents"] for record in manifest["shards"])


def test_an_unreadable_parquet_file_is_named(tmp_path):
    shard = tmp_path / "broken.parquet"
    write_shard(shard, records(0, 50))
    shard.write_bytes(shard.read_bytes()[:-100])  # the footer cut off
    with pytest.raises(ShardError, match=f"{shard}:row 0: pyarrow cannot read the file"):
        list(shard_texts(str(shard)))
    counts = CorpusReport(examples_kept=EXAMPLES_KEPT)
    assert list(shard_texts(str(shard), on_bad_input="skip", counts=counts)) == []
    assert counts.rejected == {"unreadable": 1}


def test_a_sigkilled_preparation_resumes_from_its_ledger(tmp_path, tokenizer_path):
    """A real kill (SIGKILL to the run and its litdata workers) once the first round is in
    the ledger: the rerun keeps that round and the dataset is exact."""
    import os
    import signal
    import subprocess
    import sys
    import time

    root = tmp_path / "corpus"
    shards = {f"s{number}.jsonl.gz": records(number, 2500) for number in range(4)}
    for name, rows in shards.items():
        write_shard(root / name, rows)
    out = tmp_path / "out"
    command = [sys.executable, "-m", "longctx", "prepare", str(root), str(out), "--tokenizer", tokenizer_path]
    run = subprocess.Popen(command, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ledger = out / "parts" / "node-0-of-1" / "part.json"
    deadline = time.monotonic() + 120
    while not (ledger.exists() and json.loads(ledger.read_text())["rounds"]):
        assert run.poll() is None and time.monotonic() < deadline, "the run ended before its first round was recorded"
        time.sleep(0.02)
    os.killpg(run.pid, signal.SIGKILL)
    run.wait()
    first = json.loads(ledger.read_text())["rounds"]
    assert 1 <= len(first) < 4 and not (out / MANIFEST_FILE).exists()
    stamp = (out / "parts" / "node-0-of-1" / "round-00000" / "round.json").stat().st_mtime_ns
    assert main(command[3:]) == 0
    rounds = json.loads(ledger.read_text())["rounds"]
    assert rounds[: len(first)] == first and [s for r in rounds for s in r["shards"]] == sorted(shards)
    assert (out / "parts" / "node-0-of-1" / "round-00000" / "round.json").stat().st_mtime_ns == stamp
    tokenizer = load_tokenizer(tokenizer_path)
    assert sorted(read_items(out)) == expected_items(tokenizer, [row for rows in shards.values() for row in rows])
