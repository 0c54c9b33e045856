"""Text corpora as streams of `Document`s, and their length distributions (docs/design.md §11).

This module owns *where text comes from* and what gets rejected on the way; tokenising,
packing and writing litdata shards live elsewhere. `source_texts(spec)` is the text of any
one-string source: shards (`.jsonl`, `.jsonl.zst`, `.jsonl.gz`, `.parquet`, directories and
globs of them; `shard_reader.is_shard_source`) are read by data/shard_reader.py, the only
reader of those formats; the bundled sources below by this module, each yielding documents
in a deterministic order (sorted paths):

- `embedded_documents`: what ships with the Python installation itself, so the default
  needs nothing but pip. Code = the stdlib's `.py` files (test/, tests/, idle_test/,
  site-packages, empty files and the build-generated `_sysconfigdata*` excluded); prose =
  the `pydoc_data.topics` help pages. On CPython 3.11.7: 730 code documents, 12.1 M chars
  (median 7.8 K chars, p90 36.5 K, max 756 K) and 79 prose documents, 0.46 M chars
  (median 1.7 K, p90 13.6 K). Natural lengths (most documents short, a long tail) give
  the left-skewed position frequency f(i) of STRING §2.2.
- `debian_documents`: larger optional prose from Debian doc packages (`python3.11-doc`:
  497 `*.rst.txt` files, 11.0 M chars; `linux-doc-6.1`: 3,183 files, 24 MB).
- `directory_documents`: user text files.
- `open_source(spec)`: the one-string form of these.

Rejected items (undecodable bytes, a non-string or empty text) are never dropped silently.
A bundled source records them in the `CorpusReport` passed (the one report of every reader,
data/shard_reader.py's too) and keeps going; without one the first raises `CorpusError`.
Shards follow their own `on_bad_input` policy (default: stop at the first, naming file and
line; "skip": count and record them in the report).

`length_report` summarises a length distribution (count, p10/median/mean/p90, and the
share of documents longer than each training window): the f(i) of STRING Eq. 1 is decided
by these numbers before a single step is trained.
"""

from __future__ import annotations

import sysconfig
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from longctx.data.shard_reader import (
    SHARD_SUFFIXES,
    CorpusReport,
    MetadataFilter,
    find_shards,
    is_shard_source,
    shard_texts,
)
from longctx.errors import DataError

EMBEDDED_DOMAINS = ("code", "prose")
TEXT_SUFFIXES = (".txt", ".md", ".rst")
LENGTH_WINDOWS = (1024, 2048, 4096)

_EXCLUDED_STDLIB_DIRS = frozenset({"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"})
_EXCLUDED_STDLIB_PREFIX = "_sysconfigdata"  # build paths and compiler flags: differs per build


@dataclass(frozen=True)
class DebianSource:
    """A Debian package whose files form an optional prose corpus."""

    package: str
    """Package to `apt-get install`."""
    directory: str
    """Absolute directory the package installs its text under."""
    pattern: str
    """Glob (recursive) selecting the text files inside `directory`."""


DEBIAN_SOURCES = {
    "python3.11-doc": DebianSource("python3.11-doc", "/usr/share/doc/python3.11/html/_sources", "*.rst.txt"),
    "linux-doc-6.1": DebianSource("linux-doc-6.1", "/usr/share/doc/linux-doc-6.1/html/_sources", "*.rst.txt"),
}


class CorpusError(DataError):
    """A corpus source cannot be read, or an item in it is unusable and no report collects it."""


@dataclass(frozen=True)
class Document:
    """One training document."""

    id: str
    """Stable identifier: 'stdlib:json/decoder.py', 'pydoc:assert', 'data.jsonl:17', ..."""
    text: str
    """The document's full text."""
    domain: str
    """Which kind of text: 'code', 'prose', or the label given to a user source."""


def _reject(report: CorpusReport | None, where: str, kind: str, detail: str) -> None:
    if report is None:
        raise CorpusError(f"{where}: {detail} (pass a CorpusReport to record such items and skip them)")
    report.reject(where, kind, detail)


def _document(
    report: CorpusReport | None, where: str, doc_id: str, text: object, domain: str, key: str = "text"
) -> Document | None:
    """The document for `text`, or None after recording why it is unusable."""
    if not isinstance(text, str):
        _reject(report, where, "not-a-string", f"field {key!r} is {type(text).__name__}, not a string")
        return None
    if not text.strip():
        _reject(report, where, "empty", "empty text")
        return None
    return Document(doc_id, text, domain)


def _read_text_file(path: Path, where: str, doc_id: str, domain: str, report: CorpusReport | None) -> Document | None:
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        _reject(report, where, "not-utf8", f"not UTF-8 ({err.reason} at byte {err.start})")
        return None
    return _document(report, where, doc_id, text, domain)


# --------------------------------------------------------------------------- embedded


def stdlib_root() -> Path:
    """The running interpreter's standard-library directory (a venv's base installation)."""
    return Path(sysconfig.get_paths()["stdlib"])


def _stdlib_sources(root: Path) -> list[Path]:
    selected = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root)
        if _EXCLUDED_STDLIB_DIRS.intersection(rel.parts[:-1]) or rel.name.startswith(_EXCLUDED_STDLIB_PREFIX):
            continue
        if path.stat().st_size == 0:  # empty package markers (__init__.py): not documents
            continue
        selected.append(path)
    return sorted(selected, key=lambda p: p.relative_to(root).as_posix())


def embedded_documents(
    domains: Sequence[str] = EMBEDDED_DOMAINS, report: CorpusReport | None = None
) -> Iterator[Document]:
    """Documents shipped with the Python installation: stdlib code, then pydoc prose.

    Domains are yielded in the order given; within a domain, sorted by id.
    """
    unknown = [d for d in domains if d not in EMBEDDED_DOMAINS]
    if unknown or not domains:
        raise CorpusError(f"domains={list(domains)!r}: choose one or more of {EMBEDDED_DOMAINS}")
    return _embedded(tuple(domains), report)


def _embedded(domains: tuple[str, ...], report: CorpusReport | None) -> Iterator[Document]:
    for domain in domains:
        if domain == "code":
            root = stdlib_root()
            for path in _stdlib_sources(root):
                doc_id = f"stdlib:{path.relative_to(root).as_posix()}"
                doc = _read_text_file(path, doc_id, doc_id, "code", report)
                if doc is not None:
                    yield doc
        else:
            from pydoc_data.topics import topics

            for name in sorted(topics):
                doc = _document(report, f"pydoc:{name}", f"pydoc:{name}", topics[name], "prose")
                if doc is not None:
                    yield doc


# --------------------------------------------------------------------------- files


def _files(
    files: list[Path], root: Path, id_prefix: str, domain: str, report: CorpusReport | None
) -> Iterator[Document]:
    for file in files:
        doc = _read_text_file(file, str(file), f"{id_prefix}{file.relative_to(root).as_posix()}", domain, report)
        if doc is not None:
            yield doc


def _sorted_under(root: Path, files: Iterable[Path]) -> list[Path]:
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def directory_documents(
    path: str | Path,
    suffixes: Sequence[str] = TEXT_SUFFIXES,
    domain: str = "text",
    report: CorpusReport | None = None,
) -> Iterator[Document]:
    """Every file under `path` (recursively) whose name ends with one of `suffixes`, sorted."""
    root = Path(path)
    if not root.is_dir():
        raise CorpusError(f"path={str(root)!r} is not a directory")
    files = _sorted_under(root, (p for p in root.rglob("*") if p.is_file() and p.name.endswith(tuple(suffixes))))
    if not files:
        raise CorpusError(f"path={str(root)!r} holds no file ending with {tuple(suffixes)}")
    return _files(files, root, f"{root.name}/", domain, report)


def debian_documents(package: str, report: CorpusReport | None = None, root: str | Path = "/") -> Iterator[Document]:
    """Prose from an installed Debian doc package (see `DEBIAN_SOURCES`).

    `root` is where the package's tree lives: '/' once installed, or the directory a
    `dpkg -x package.deb DIR` extracted it to (no root rights needed).
    """
    if package not in DEBIAN_SOURCES:
        raise CorpusError(f"package={package!r}: known Debian sources are {sorted(DEBIAN_SOURCES)}")
    source = DEBIAN_SOURCES[package]
    directory = Path(root) / source.directory.lstrip("/")
    if not directory.is_dir():
        raise CorpusError(
            f"{directory} does not exist: it is installed by the Debian package {source.package} "
            f"(`apt-get install {source.package}`, or `apt-get download {source.package}` and "
            f"`dpkg -x {source.package}_*.deb DIR` then pass root=DIR)"
        )
    files = _sorted_under(directory, directory.rglob(source.pattern))
    return _files(files, directory, f"debian:{package}/", "prose", report)


def open_source(spec: str, report: CorpusReport | None = None) -> Iterator[Document]:
    """Documents named by one config string.

    '' or 'embedded'             -> the embedded corpus (code and prose)
    'embedded:code', 'embedded:prose', 'embedded:code,prose'
    'debian:PACKAGE'             -> an installed Debian doc package (`DEBIAN_SOURCES`)
    'DIRECTORY'                  -> its *.txt, *.md, *.rst files

    A spec naming shards is refused: their records are texts without documents' ids, read by
    `source_texts` through data/shard_reader.py.
    """
    if spec in ("", "embedded"):
        return embedded_documents(report=report)
    if spec.startswith("embedded:"):
        return embedded_documents(tuple(spec.removeprefix("embedded:").split(",")), report=report)
    if spec.startswith("debian:"):
        return debian_documents(spec.removeprefix("debian:"), report=report)
    if is_shard_source(spec):
        raise CorpusError(f"data source {spec!r} names shards: read it with source_texts (data/shard_reader.py)")
    if Path(spec).is_dir():
        return directory_documents(spec, report=report)
    raise CorpusError(
        f"data source {spec!r} is not understood: use '' / 'embedded[:code|prose]', 'debian:PACKAGE', "
        f"shards (files ending with one of {SHARD_SUFFIXES}, directories or globs of them), "
        "or an existing directory of text files"
    )


def source_texts(
    spec: str,
    report: CorpusReport | None = None,
    *,
    text_key: str = "text",
    keep: MetadataFilter | None = None,
    on_bad_input: str = "error",
) -> Iterator[str]:
    """The text of every document of one source string, in its stable order: what `longctx
    prepare` and `longctx fi` read.

    Shards are read by data/shard_reader.py under `on_bad_input` ("error": stop at the first
    bad line, naming file and line; "skip": count it in `report` and go on), with `text_key`
    and `keep` selecting each record's text; any other spec goes through `open_source`, whose
    rejected items `report` records. `report.documents` counts what was yielded.
    """
    if is_shard_source(spec):
        shards = find_shards([spec])  # a missing file or an empty glob fails here, before reading
        return _shard_source_texts([shard.path for shard in shards], report, text_key, keep, on_bad_input)
    return _document_texts(open_source(spec, report), report)


def _shard_source_texts(
    paths: list[str], report: CorpusReport | None, text_key: str, keep: MetadataFilter | None, on_bad_input: str
) -> Iterator[str]:
    for path in paths:
        yield from shard_texts(path, text_key=text_key, keep=keep, on_bad_input=on_bad_input, counts=report)


def _document_texts(documents: Iterator[Document], report: CorpusReport | None) -> Iterator[str]:
    for document in documents:
        if report is not None:
            report.documents += 1
        yield document.text


# --------------------------------------------------------------------------- lengths


def length_report(lengths: Iterable[int] | np.ndarray, windows: Sequence[int] = LENGTH_WINDOWS) -> dict[str, float]:
    """Summary of a document-length distribution: the manifest's `lengths` block.

    Keys: count, total, min, p10, median, mean, p90, max, and for each window w
    `longer_than_{w}`, the share of documents with length > w. Percentiles interpolate
    linearly between closest ranks (numpy's default); computed with numpy, so a corpus of
    hundreds of millions of documents is summarised in seconds.
    """
    ordered = np.asarray(lengths if isinstance(lengths, np.ndarray) else list(lengths), dtype=np.int64)
    if not len(ordered):
        raise ValueError("lengths is empty: no document to report on")
    if ordered.min() < 0:
        raise ValueError(f"lengths holds a negative length {int(ordered.min())}")
    p10, median, p90 = np.percentile(ordered, [10, 50, 90])
    report: dict[str, float] = {
        "count": len(ordered),
        "total": int(ordered.sum()),
        "min": int(ordered.min()),
        "p10": float(p10),
        "median": float(median),
        "mean": float(ordered.mean()),
        "p90": float(p90),
        "max": int(ordered.max()),
    }
    for window in windows:
        report[f"longer_than_{window}"] = float((ordered > window).mean())
    return report


def format_length_report(report: dict[str, float], unit: str = "tokens") -> str:
    """Two lines for a log: the distribution, then the share longer than each window."""
    head = (
        f"{int(report['count'])} documents, {int(report['total']):,} {unit}; length min {report['min']:.0f} "
        f"p10 {report['p10']:.0f} median {report['median']:.0f} mean {report['mean']:.0f} "
        f"p90 {report['p90']:.0f} max {report['max']:.0f}"
    )
    shares = [
        f"> {key.removeprefix('longer_than_')}: {value:.1%}"
        for key, value in report.items()
        if key.startswith("longer_than_")
    ]
    return head + ("\nshare of documents " + ", ".join(shares) if shares else "")
