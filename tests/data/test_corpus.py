"""Corpus sources: selection rules, deterministic order, rejected-item reporting, length stats."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from longctx.data import corpus
from longctx.data.corpus import (
    CorpusError,
    CorpusReport,
    debian_documents,
    embedded_documents,
    format_length_report,
    length_report,
    open_source,
    source_texts,
)
from longctx.data.shard_reader import ShardError


@pytest.fixture(scope="module")
def embedded():
    report = CorpusReport()
    return list(embedded_documents(report=report)), report


# --------------------------------------------------------------------------- embedded


def test_embedded_corpus_is_deterministic_sorted_and_split_by_domain(embedded):
    docs, report = embedded
    assert [d.id for d in docs] == [d.id for d in embedded_documents()]
    code = [d for d in docs if d.domain == "code"]
    prose = [d for d in docs if d.domain == "prose"]
    assert len(code) + len(prose) == len(docs)
    assert docs[: len(code)] == code  # code first, then prose, as `domains` is ordered
    assert [d.id for d in code] == sorted(d.id for d in code)
    assert [d.id for d in prose] == sorted(d.id for d in prose)
    assert len({d.id for d in docs}) == len(docs)
    assert report.rejections == []


def test_embedded_documents_are_the_installed_files_and_pydoc_topics(embedded):
    import json.decoder
    from pydoc_data.topics import topics

    by_id = {d.id: d for d in embedded[0]}
    assert by_id["stdlib:json/decoder.py"].text == Path(json.decoder.__file__).read_text("utf-8")
    assert by_id["pydoc:assert"].text == topics["assert"]
    assert {i for i in by_id if i.startswith("pydoc:")} == {f"pydoc:{name}" for name in topics}
    for doc_id in by_id:
        parts = doc_id.removeprefix("stdlib:").split("/")
        assert not {"test", "tests", "idle_test", "site-packages"} & set(parts[:-1]), doc_id
    assert len([i for i in by_id if i.startswith("stdlib:")]) > 500  # the real stdlib, not a stub


def test_embedded_domain_filter():
    prose = list(embedded_documents(("prose",)))
    assert prose and {d.domain for d in prose} == {"prose"}
    assert [d.id for d in open_source("embedded:prose")] == [d.id for d in prose]
    with pytest.raises(CorpusError, match="domains"):
        embedded_documents(("poetry",))  # raised at the call, before iteration


def test_stdlib_selection_rules_and_undecodable_files(tmp_path, monkeypatch):
    files = {
        "b.py": b"x = 1\n",
        "a.py": b"y = 2\n",
        "pkg/__init__.py": b"",  # empty: not a document
        "pkg/mod.py": b"z = 3\n",
        "pkg/latin1.py": "s = 'caf\xe9'\n".encode("latin-1"),
        "test/test_a.py": b"t = 1\n",
        "pkg/tests/test_b.py": b"t = 2\n",
        "idlelib/idle_test/t.py": b"t = 3\n",
        "site-packages/numpy/x.py": b"t = 4\n",
        "_sysconfigdata__linux.py": b"build = {}\n",
        "notes.txt": b"not python\n",
    }
    for name, data in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(data)
    monkeypatch.setattr(corpus, "stdlib_root", lambda: tmp_path)

    report = CorpusReport()
    docs = list(embedded_documents(("code",), report=report))
    assert [d.id for d in docs] == ["stdlib:a.py", "stdlib:b.py", "stdlib:pkg/mod.py"]
    assert [(r.where, r.kind) for r in report.rejections] == [("stdlib:pkg/latin1.py", "not-utf8")]
    with pytest.raises(CorpusError, match="stdlib:pkg/latin1.py.*not UTF-8"):
        list(embedded_documents(("code",)))


# --------------------------------------------------------------------------- JSONL


def _write_jsonl(path: Path) -> None:
    lines = [
        json.dumps({"text": "first document"}).encode(),  # 1 ok
        b'{"text": "unterminated',  # 2 bad JSON
        json.dumps({"content": "wrong key"}).encode(),  # 3 missing key
        json.dumps({"text": "   \n"}).encode(),  # 4 empty
        json.dumps({"text": 42}).encode(),  # 5 not a string
        json.dumps(["text", "a list"]).encode(),  # 6 not an object
        b"",  # 7 blank line
        b'{"text": "caf\xe9"}',  # 8 latin-1 byte
        json.dumps({"text": "last document", "meta": 1}).encode(),  # 9 ok
    ]
    path.write_bytes(b"\n".join(lines) + b"\n")


def test_jsonl_rejections_carry_file_and_line(tmp_path):
    """A .jsonl source is read by data/shard_reader.py: under "skip" every bad line is counted
    and recorded with its file and line."""
    path = tmp_path / "data.jsonl"
    _write_jsonl(path)
    report = CorpusReport()
    texts = list(source_texts(str(path), report, on_bad_input="skip"))
    assert texts == ["first document", "last document"] and report.documents == 2
    expected = [
        (2, "bad-json"),
        (3, "missing-key"),
        (4, "empty"),
        (5, "not-a-string"),
        (6, "not-an-object"),
        (7, "bad-json"),
        (8, "not-utf8"),
    ]
    assert [(r.where, r.kind) for r in report.rejections] == [(f"{path}:{n}", kind) for n, kind in expected]
    assert report.count_by_kind() == {
        "bad-json": 2,
        "missing-key": 1,
        "empty": 1,
        "not-a-string": 1,
        "not-an-object": 1,
        "not-utf8": 1,
    }
    assert "rejected: 7" in report.summary()


def test_jsonl_raises_at_the_first_bad_line_by_default(tmp_path):
    path = tmp_path / "data.jsonl"
    _write_jsonl(path)
    with pytest.raises(ShardError, match=r"data\.jsonl:2: bad JSON"):
        list(source_texts(str(path)))
    with pytest.raises(ShardError, match=r"data\.jsonl:2: bad JSON"):
        list(source_texts(str(path), CorpusReport()))  # a report does not change the policy


def test_jsonl_custom_text_key(tmp_path):
    path = tmp_path / "chat.jsonl"
    path.write_text(json.dumps({"content": "hello"}) + "\n")
    assert list(source_texts(str(path), text_key="content")) == ["hello"]
    with pytest.raises(ShardError, match=r"chat\.jsonl:1: no 'text' key"):
        list(source_texts(str(path)))


# --------------------------------------------------------------------------- parquet


def test_parquet_rows_and_rejections(tmp_path):
    pa = pytest.importorskip("pyarrow", reason="pyarrow is not installed (parquet is optional)")
    import pyarrow.parquet as pq

    path = tmp_path / "data.parquet"
    pq.write_table(pa.table({"text": ["one", None, "", "four"], "n": [1, 2, 3, 4]}), path)
    report = CorpusReport()
    assert list(source_texts(str(path), report, on_bad_input="skip")) == ["one", "four"]
    assert [(r.where, r.kind) for r in report.rejections] == [
        (f"{path}:row 1", "not-a-string"),
        (f"{path}:row 2", "empty"),
    ]
    with pytest.raises(ShardError, match=r"data\.parquet:row 1: field 'text' is NoneType"):
        list(source_texts(str(path)))
    with pytest.raises(ShardError, match="no column 'body'"):
        list(source_texts(str(path), text_key="body"))


def test_parquet_without_pyarrow_names_the_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)  # makes the import fail
    (tmp_path / "x.parquet").write_bytes(b"PAR1")
    with pytest.raises(ShardError, match="pip install 'longctx\\[corpora\\]'"):
        list(source_texts(str(tmp_path / "x.parquet")))


# --------------------------------------------------------------------------- directories


def test_directory_documents_sorted_and_filtered(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "b.txt").write_text("bee")
    (tmp_path / "a.md").write_text("ay")
    (tmp_path / "sub" / "c.rst.txt").write_text("sea")
    (tmp_path / "sub" / "d.rst").write_text("dee")
    (tmp_path / "ignored.py").write_text("x = 1")
    (tmp_path / "empty.txt").write_text("")
    report = CorpusReport()
    docs = list(open_source(str(tmp_path), report=report))
    root = tmp_path.name
    assert [d.id for d in docs] == [f"{root}/a.md", f"{root}/b.txt", f"{root}/sub/c.rst.txt", f"{root}/sub/d.rst"]
    assert [d.text for d in docs] == ["ay", "bee", "sea", "dee"]
    assert [r.kind for r in report.rejections] == ["empty"]


def test_debian_documents_missing_package_names_it(tmp_path):
    with pytest.raises(CorpusError, match=r"python3\.11-doc.*apt-get install python3\.11-doc"):
        debian_documents("python3.11-doc", root=tmp_path)
    with pytest.raises(CorpusError, match="known Debian sources"):
        debian_documents("no-such-doc")


def test_debian_documents_read_an_extracted_tree(tmp_path):
    sources = tmp_path / "usr/share/doc/python3.11/html/_sources"
    (sources / "library").mkdir(parents=True)
    (sources / "library" / "json.rst.txt").write_text("json docs")
    (sources / "about.rst.txt").write_text("about")
    (sources / "searchindex.js").write_text("not prose")
    docs = list(debian_documents("python3.11-doc", root=tmp_path))
    assert [(d.id, d.domain) for d in docs] == [
        ("debian:python3.11-doc/about.rst.txt", "prose"),
        ("debian:python3.11-doc/library/json.rst.txt", "prose"),
    ]


def test_open_source_rejects_unknown_specs(tmp_path):
    with pytest.raises(CorpusError, match="not understood"):
        open_source(str(tmp_path / "missing.csv"))
    with pytest.raises(CorpusError, match="domains"):
        open_source("embedded:poetry")
    with pytest.raises(ShardError, match="no such file"):
        source_texts(str(tmp_path / "missing.jsonl"))
    with pytest.raises(CorpusError, match="holds no file"):
        open_source(str(tmp_path))


def test_shards_are_read_by_the_shard_reader_only(tmp_path):
    """One rule recognises shards: open_source refuses them, source_texts reads a directory
    holding one (not its text files) as data/shard_reader.py does."""
    (tmp_path / "notes.txt").write_text("a text file")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "part.jsonl").write_text(json.dumps({"text": "a record"}) + "\n")
    with pytest.raises(CorpusError, match="names shards"):
        open_source(str(tmp_path))
    assert list(source_texts(str(tmp_path))) == ["a record"]
    assert list(source_texts(str(tmp_path / "*" / "*.jsonl"))) == ["a record"]


# --------------------------------------------------------------------------- lengths


def test_length_report_matches_numpy():
    rng = np.random.default_rng(0)
    lengths = rng.lognormal(mean=7.0, sigma=1.3, size=1001).astype(int)
    report = length_report(lengths.tolist(), windows=(512, 2048))
    assert report["count"] == 1001
    assert report["total"] == lengths.sum()
    assert report["min"] == lengths.min() and report["max"] == lengths.max()
    assert report["mean"] == pytest.approx(lengths.mean())
    for key, q in (("p10", 10), ("median", 50), ("p90", 90)):
        assert report[key] == pytest.approx(np.percentile(lengths, q)), key
    assert report["longer_than_512"] == pytest.approx((lengths > 512).mean())
    assert report["longer_than_2048"] == pytest.approx((lengths > 2048).mean())


def test_length_report_hand_example_and_errors():
    report = length_report([4, 1, 3, 2], windows=(2,))
    assert (report["median"], report["p10"], report["p90"]) == pytest.approx((2.5, 1.3, 3.7))
    assert report["longer_than_2"] == 0.5
    text = format_length_report(report, unit="chars")
    assert "4 documents, 10 chars" in text and "> 2: 50.0%" in text
    with pytest.raises(ValueError, match="empty"):
        length_report([])
    with pytest.raises(ValueError, match="negative"):
        length_report([3, -1])
