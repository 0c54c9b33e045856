"""Text corpora as streams of `Document`s, and their length distributions (docs/design.md §11).

This module owns *where text comes from* and what gets rejected on the way; tokenising,
packing and writing litdata shards live elsewhere. Sources, each yielding documents in a
deterministic order (sorted paths, file order for JSONL/parquet):

- `embedded_documents`: what ships with the Python installation itself, so the default
  needs nothing but pip. Code = the stdlib's `.py` files (test/, tests/, idle_test/,
  site-packages, empty files and the build-generated `_sysconfigdata*` excluded); prose =
  the `pydoc_data.topics` help pages. On CPython 3.11.7: 730 code documents, 12.1 M chars
  (median 7.8 K chars, p90 36.5 K, max 756 K) and 79 prose documents, 0.46 M chars
  (median 1.7 K, p90 13.6 K). Natural lengths (most documents short, a long tail) give
  the left-skewed position frequency f(i) of STRING §2.2.
- `debian_documents`: larger optional prose from Debian doc packages (`python3.11-doc`:
  497 `*.rst.txt` files, 11.0 M chars; `linux-doc-6.1`: 3,183 files, 24 MB).
- `jsonl_documents` / `parquet_documents` / `directory_documents`: user text.
- `open_source(spec)`: the one-string form configs use (`data.path`).

Rejected items (undecodable bytes, bad JSON, a missing or non-string text field, empty
text) are never dropped silently: pass a `CorpusReport` to record them with their file and
line (or row) and keep going; without one the first rejected item raises `CorpusError`.

`length_report` summarises a length distribution (count, p10/median/mean/p90, and the
share of documents longer than each training window): the f(i) of STRING Eq. 1 is decided
by these numbers before a single step is trained.
"""

from __future__ import annotations

import json
import math
import sysconfig
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

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


@dataclass(frozen=True)
class Rejection:
    """An item a source could not turn into a document."""

    where: str
    """File and line (JSONL, 1-based), row (parquet, 0-based) or document id."""
    kind: str
    """Short category: not-utf8 | bad-json | not-an-object | missing-key | not-a-string | empty."""
    detail: str
    """Human-readable reason."""


@dataclass
class CorpusReport:
    """Collects rejected items so a caller can count and print them."""

    rejections: list[Rejection] = field(default_factory=list)
    """Every rejected item, in the order met."""

    def count_by_kind(self) -> dict[str, int]:
        return dict(Counter(r.kind for r in self.rejections))

    def summary(self, examples: int = 5) -> str:
        if not self.rejections:
            return "rejected: none"
        kinds = ", ".join(f"{n} {kind}" for kind, n in sorted(self.count_by_kind().items()))
        lines = [f"rejected: {len(self.rejections)} ({kinds})"]
        lines += [f"  {r.where}: {r.detail}" for r in self.rejections[:examples]]
        if len(self.rejections) > examples:
            lines.append(f"  ... and {len(self.rejections) - examples} more")
        return "\n".join(lines)


def _reject(report: CorpusReport | None, where: str, kind: str, detail: str) -> None:
    if report is None:
        raise CorpusError(f"{where}: {detail} (pass a CorpusReport to record such items and skip them)")
    report.rejections.append(Rejection(where, kind, detail))


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


def jsonl_documents(
    path: str | Path, text_key: str = "text", domain: str = "text", report: CorpusReport | None = None
) -> Iterator[Document]:
    """One document per line of a JSON Lines file: the string under `text_key` of each object."""
    path = Path(path)
    if not path.is_file():
        raise CorpusError(f"path={str(path)!r} is not a file")
    return _jsonl(path, text_key, domain, report)


def _jsonl(path: Path, text_key: str, domain: str, report: CorpusReport | None) -> Iterator[Document]:
    with path.open("rb") as lines:
        for number, raw in enumerate(lines, start=1):
            where = f"{path}:{number}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                _reject(report, where, "not-utf8", f"not UTF-8 ({err.reason} at byte {err.start})")
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                _reject(report, where, "bad-json", f"bad JSON: {err.msg} at column {err.colno}")
                continue
            if not isinstance(record, dict):
                _reject(report, where, "not-an-object", f"a JSON {type(record).__name__}, not an object")
                continue
            if text_key not in record:
                _reject(report, where, "missing-key", f"no {text_key!r} key (keys: {sorted(record)[:8]})")
                continue
            doc = _document(report, where, f"{path.name}:{number}", record[text_key], domain, text_key)
            if doc is not None:
                yield doc


def parquet_documents(
    path: str | Path, text_key: str = "text", domain: str = "text", report: CorpusReport | None = None
) -> Iterator[Document]:
    """One document per row of a parquet file: its `text_key` column (needs pyarrow)."""
    try:
        import pyarrow.parquet as pq
    except ImportError as err:
        raise CorpusError(f"reading {path} needs pyarrow: pip install pyarrow") from err
    path = Path(path)
    if not path.is_file():
        raise CorpusError(f"path={str(path)!r} is not a file")
    table = pq.ParquetFile(path)
    if text_key not in table.schema_arrow.names:
        raise CorpusError(f"{path}: no column {text_key!r} (columns: {table.schema_arrow.names})")
    return _parquet(path, table, text_key, domain, report)


def _parquet(path: Path, table, text_key: str, domain: str, report: CorpusReport | None) -> Iterator[Document]:
    row = 0
    for batch in table.iter_batches(columns=[text_key], batch_size=1024):
        for text in batch.column(0).to_pylist():
            doc = _document(report, f"{path}:row {row}", f"{path.name}:{row}", text, domain, text_key)
            if doc is not None:
                yield doc
            row += 1


def open_source(spec: str, report: CorpusReport | None = None) -> Iterator[Document]:
    """Documents named by one config string.

    '' or 'embedded'             -> the embedded corpus (code and prose)
    'embedded:code', 'embedded:prose', 'embedded:code,prose'
    'debian:PACKAGE'             -> an installed Debian doc package (`DEBIAN_SOURCES`)
    'PATH.jsonl', 'PATH.parquet' -> one document per line / row, text under 'text'
    'DIRECTORY'                  -> its *.txt, *.md, *.rst files
    """
    if spec in ("", "embedded"):
        return embedded_documents(report=report)
    if spec.startswith("embedded:"):
        return embedded_documents(tuple(spec.removeprefix("embedded:").split(",")), report=report)
    if spec.startswith("debian:"):
        return debian_documents(spec.removeprefix("debian:"), report=report)
    if spec.endswith(".jsonl"):
        return jsonl_documents(spec, report=report)
    if spec.endswith(".parquet"):
        return parquet_documents(spec, report=report)
    if Path(spec).is_dir():
        return directory_documents(spec, report=report)
    raise CorpusError(
        f"data source {spec!r} is not understood: use '' / 'embedded[:code|prose]', 'debian:PACKAGE', "
        "a .jsonl or .parquet file, or an existing directory of text files"
    )


# --------------------------------------------------------------------------- lengths


def _percentile(ordered: Sequence[int], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default 'linear' method)."""
    h = (len(ordered) - 1) * q
    lo = math.floor(h)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (h - lo) * (ordered[hi] - ordered[lo])


def length_report(lengths: Iterable[int], windows: Sequence[int] = LENGTH_WINDOWS) -> dict[str, float]:
    """Summary of a document-length distribution.

    Keys: count, total, min, p10, median, mean, p90, max, and for each window w
    `longer_than_{w}`, the share of documents with length > w.
    """
    ordered = sorted(lengths)
    if not ordered:
        raise ValueError("lengths is empty: no document to report on")
    if ordered[0] < 0:
        raise ValueError(f"lengths holds a negative length {ordered[0]}")
    count = len(ordered)
    report: dict[str, float] = {
        "count": count,
        "total": sum(ordered),
        "min": ordered[0],
        "p10": _percentile(ordered, 0.10),
        "median": _percentile(ordered, 0.50),
        "mean": sum(ordered) / count,
        "p90": _percentile(ordered, 0.90),
        "max": ordered[-1],
    }
    for window in windows:
        report[f"longer_than_{window}"] = sum(1 for n in ordered if n > window) / count
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
