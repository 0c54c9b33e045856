"""Pretraining corpora as they ship: directories and globs of `.jsonl`, `.jsonl.zst`,
`.jsonl.gz` and `.parquet` shards, read one record at a time.

SlimPajama-627B (the corpus of STRING §2-3 and Appendix A.2) ships as thousands of
`train/chunkN/example_train_K.jsonl.zst` files whose lines are
`{"text": ..., "meta": {"redpajama_set_name": "RedPajamaC4"}}`; StarCoderData and
FineWeb(-Edu) ship as parquet shards. This module finds such shards in a stable order and
streams the text of each record: a shard is never held in memory (jsonl: one line at a
time through a streaming decompressor; parquet: record batches of `PARQUET_BATCH_ROWS` rows
of only the columns needed, pyarrow holding at most one row group's column chunks).

    find_shards(["data/slimpajama/train", "more/*.parquet"])   # sorted Shard list
    shard_texts(path, text_key="text", keep=MetadataFilter.parse("meta.redpajama_set_name=RedPajamaGithub", keep=False))

Order: the specs in the order given; under each, files sorted by their path relative to the
spec's root (a directory, or a glob's directory part before the first wildcard), so every
machine that mounts the corpus sees the same list (node sharding relies on it).

One rule decides what a shard is: a name ending with a suffix of `SHARD_READERS`, the one
table from suffix to reader (adding a corpus format: docs/data.md); `is_shard_source` decides
whether a source string names shards (a glob, a shard file, or a directory holding one), for
`longctx prepare`, `longctx fi` and `corpus.source_texts` alike.

Bad input. A corrupt or truncated `.zst`/`.gz` stream, a line that is not UTF-8 or not a
JSON object, a record without the text key or with a non-string or empty text, a parquet
file pyarrow cannot read, and an empty shard are each a `ShardError` naming the shard and
line (1-based) or row (0-based) under `on_bad_input="error"` (the default). Under
`on_bad_input="skip"` each is counted by kind in a `CorpusReport` (which `longctx prepare`
writes to its manifest and `longctx fi` prints) and reading goes on; a corrupt stream ends
its shard there (the records after the damage cannot be found), counted as `corrupt-stream`.

`.gz` is read with the standard library; `.zst` needs `zstandard` and `.parquet` needs
`pyarrow` (the `corpora` extra: `pip install longctx[corpora]`).
"""

from __future__ import annotations

import glob
import gzip
import json
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from longctx.errors import DataError

BAD_INPUT_POLICIES = ("error", "skip")
PARQUET_BATCH_ROWS = 1024
READ_BYTES = 1 << 20
EXAMPLES_KEPT = 20
"""Rejected items a shard-scale `CorpusReport` lists with their place (all are counted)."""


class ShardError(DataError):
    """A shard cannot be found or read, or one of its records is unusable under on_bad_input=error."""


@dataclass(frozen=True)
class Shard:
    """One input file."""

    path: str
    """Where to open it."""
    name: str
    """Its path relative to the root of the spec that found it (the manifest's name)."""
    bytes: int
    """File size."""


def is_shard(name: str) -> bool:
    """Whether a file of this name is a shard: its name ends with a suffix of `SHARD_READERS`."""
    return name.endswith(SHARD_SUFFIXES)


def is_shard_source(spec: str) -> bool:
    """Whether a source string names shards: a glob, a shard's name (found or not: reading
    it then says what is wrong), or a directory holding a shard at any depth. Anything else
    is one of data/corpus.py's bundled sources (embedded, debian:PACKAGE, a directory of text)."""
    if _has_wildcard(spec) or is_shard(spec):
        return True
    path = Path(spec)
    return path.is_dir() and next(_shards_under(path), None) is not None


def _has_wildcard(spec: str) -> bool:
    return any(c in spec for c in "*?[")


def _glob_root(spec: str) -> Path:
    parts = Path(spec).parts
    prefix = list(parts[: next(i for i, p in enumerate(parts) if _has_wildcard(p))])
    return Path(*prefix) if prefix else Path(".")


def _shards_under(directory: Path) -> Iterator[Path]:
    return (p for p in directory.rglob("*") if p.is_file() and is_shard(p.name))


def _under(root: Path, files: Iterable[Path]) -> list[tuple[str, Path]]:
    return sorted((p.relative_to(root).as_posix(), p) for p in files)


def find_shards(specs: Sequence[str]) -> list[Shard]:
    """The shards named by `specs` (files, directories searched recursively, globs with
    `**` for any depth), in the stable order described above; a file named twice counts once."""
    found: list[Shard] = []
    seen: set[Path] = set()
    for spec in specs:
        path = Path(spec)
        if _has_wildcard(spec):
            root = _glob_root(spec)
            files: list[Path] = []
            for match in map(Path, glob.glob(spec, recursive=True)):
                if match.is_dir():
                    files += _shards_under(match)
                elif match.is_file() and is_shard(match.name):
                    files.append(match)
            named = _under(root, files)
        elif path.is_dir():
            named = _under(path, _shards_under(path))
        elif path.is_file():
            if not is_shard(path.name):
                raise ShardError(f"{spec}: not a shard (a shard's name ends with one of {SHARD_SUFFIXES})")
            named = [(path.name, path)]
        else:
            raise ShardError(f"{spec}: no such file or directory")
        if not named:
            raise ShardError(f"{spec}: holds no file ending with one of {SHARD_SUFFIXES}")
        for name, file in named:
            if file.resolve() not in seen:
                seen.add(file.resolve())
                found.append(Shard(str(file), name, file.stat().st_size))
    names = Counter(shard.name for shard in found)
    # Two SRCs holding the same relative name (a/x.jsonl, b/x.jsonl): those are named by their path.
    return [Shard(s.path, s.path, s.bytes) if names[s.name] > 1 else s for s in found]


def field_value(record: dict, key: str) -> Any:
    """`record[key]`, or for a dotted key (`meta.redpajama_set_name`) the nested value;
    `MISSING` when absent."""
    if key in record:
        return record[key]
    value: Any = record
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return MISSING
        value = value[part]
    return value


MISSING = object()


@dataclass(frozen=True)
class MetadataFilter:
    """Keep (or drop) the records whose field `key` (dotted for nested: `meta.redpajama_set_name`)
    is one of `values`. A record without the field is dropped by a keep-filter and kept by
    a drop-filter. Filtered records are counted (`CorpusReport.filtered`), not rejected."""

    key: str
    values: frozenset[str]
    keep: bool

    @classmethod
    def parse(cls, spec: str, keep: bool) -> MetadataFilter:
        """From `KEY=VALUE[,VALUE...]` (the form of `--keep` / `--drop`)."""
        key, sep, values = spec.partition("=")
        names = frozenset(v.strip() for v in values.split(",") if v.strip())
        if not sep or not key.strip() or not names:
            flag = "--keep" if keep else "--drop"
            raise ShardError(
                f"{flag} {spec!r}: expected KEY=VALUE[,VALUE...], e.g. meta.redpajama_set_name=RedPajamaGithub"
            )
        return cls(key.strip(), names, keep)

    def admits(self, record: dict) -> bool:
        value = field_value(record, self.key)
        return (value is not MISSING and str(value) in self.values) == self.keep

    def describe(self) -> str:
        return f"{'keep' if self.keep else 'drop'} {self.key} in {sorted(self.values)}"


@dataclass(frozen=True)
class Rejection:
    """An item a source could not turn into a document."""

    where: str
    """File and line (JSONL, 1-based), row (parquet, 0-based) or document id."""
    kind: str
    """Short category: not-utf8 | bad-json | not-an-object | missing-key | not-a-string | empty |
    corrupt-stream | unreadable | empty-shard."""
    detail: str
    """Human-readable reason."""


@dataclass
class CorpusReport:
    """What reading a source produced and passed over: the one report of every reader (shards,
    and data/corpus.py's bundled sources), so `prepare`, `fi` and their manifests count bad
    input the same way.

    Counts cover every item; `rejections` lists them with their place up to `examples_kept`
    (None: all, for sources read into memory anyway; a corpus of billions of records keeps
    `EXAMPLES_KEPT`)."""

    examples_kept: int | None = None
    """How many rejected items `rejections` lists (None: all)."""
    documents: int = 0
    """Records whose text was yielded."""
    filtered: int = 0
    """Records the metadata filter left out."""
    rejected: Counter = field(default_factory=Counter)
    """Rejected items by kind (see `Rejection.kind`)."""
    rejections: list[Rejection] = field(default_factory=list)
    """The rejected items, in the order met, the first `examples_kept` of them."""

    def reject(self, where: str, kind: str, detail: str) -> None:
        """Count an item left out as unusable, and list it while there is room."""
        self.rejected[kind] += 1
        if self.examples_kept is None or len(self.rejections) < self.examples_kept:
            self.rejections.append(Rejection(where, kind, detail))

    def count_by_kind(self) -> dict[str, int]:
        return dict(self.rejected)

    def summary(self, examples: int = 5) -> str:
        total = sum(self.rejected.values())
        if not total:
            return "rejected: none"
        kinds = ", ".join(f"{n} {kind}" for kind, n in sorted(self.rejected.items()))
        lines = [f"rejected: {total} ({kinds})"]
        lines += [f"  {r.where}: {r.detail}" for r in self.rejections[:examples]]
        if total > min(examples, len(self.rejections)):
            lines.append(f"  ... and {total - min(examples, len(self.rejections))} more")
        return "\n".join(lines)


class ShardReading:
    """One shard being read: what a format's reader (a value of `SHARD_READERS`) is given.

    The reader opens `path`, calls `drawn()` once per record before parsing it (False: leave
    it out uncounted), hands each parsed record to `text()` and yields what is not None, and
    reports what it cannot parse to `bad()`: the policy (raise or count) is applied here,
    never in a reader."""

    def __init__(
        self,
        path: str,
        *,
        text_key: str,
        keep: MetadataFilter | None,
        on_bad_input: str,
        report: CorpusReport,
        select: Callable[[], bool] | None,
    ):
        if on_bad_input not in BAD_INPUT_POLICIES:
            raise ShardError(f"on_bad_input={on_bad_input!r}: choose one of {BAD_INPUT_POLICIES}")
        self.path, self.text_key, self.keep = path, text_key, keep
        self.skip, self.report, self.select = on_bad_input == "skip", report, select

    def drawn(self) -> bool:
        return self.select is None or self.select()

    def bad(self, where: str, kind: str, detail: str) -> None:
        if not self.skip:
            raise ShardError(
                f"{where}: {detail} (--on-bad-input skip skips such items, counts them and reports where they are)"
            )
        self.report.reject(where, kind, detail)

    def text(self, record: Any, where: str) -> str | None:
        """The record's text, or None after counting why not (filtered, or bad)."""
        if not isinstance(record, dict):
            self.bad(where, "not-an-object", f"a JSON {type(record).__name__}, not an object")
            return None
        if self.keep is not None and not self.keep.admits(record):
            self.report.filtered += 1
            return None
        text = field_value(record, self.text_key)
        if text is MISSING:
            self.bad(where, "missing-key", f"no {self.text_key!r} key (keys: {sorted(record)[:8]})")
            return None
        if not isinstance(text, str):
            self.bad(where, "not-a-string", f"field {self.text_key!r} is {type(text).__name__}, not a string")
            return None
        if not text.strip():
            self.bad(where, "empty", "empty text")
            return None
        self.report.documents += 1
        return text


ShardReader = Callable[[ShardReading], Iterator[str]]
"""Streams the text of one shard's records (see `ShardReading` for its duties)."""


def shard_texts(
    path: str,
    *,
    text_key: str = "text",
    keep: MetadataFilter | None = None,
    on_bad_input: str = "error",
    counts: CorpusReport | None = None,
    select: Callable[[], bool] | None = None,
) -> Iterator[str]:
    """The text of every usable record of one shard, in file order, streamed by the reader
    its suffix selects in `SHARD_READERS`.

    `counts` collects documents, filtered records and skipped items. `select`, when given,
    is called once per record (line or row) before it is parsed; a False leaves the record
    out uncounted (`longctx fi --sample` draws its uniform sample this way).
    """
    report = counts if counts is not None else CorpusReport(examples_kept=EXAMPLES_KEPT)
    reading = ShardReading(path, text_key=text_key, keep=keep, on_bad_input=on_bad_input, report=report, select=select)
    return _reader_for(path)(reading)


def _reader_for(path: str) -> ShardReader:
    suffixes = [suffix for suffix in SHARD_READERS if path.endswith(suffix)]
    if not suffixes:
        raise ShardError(f"{path}: not a shard (a shard's name ends with one of {SHARD_SUFFIXES})")
    return SHARD_READERS[max(suffixes, key=len)]


# --------------------------------------------------------------------------- JSON Lines


def _zstd_blocks(handle: BinaryIO) -> Iterator[bytes]:
    """Decompressed bytes of every frame of a .zst file; EOFError when the last frame is cut off."""
    try:
        import zstandard
    except ImportError as err:
        raise ShardError("reading .zst shards needs zstandard: pip install 'longctx[corpora]'") from err
    decompressor = zstandard.ZstdDecompressor()
    stream = decompressor.decompressobj()
    pending = False  # inside a frame
    while block := handle.read(READ_BYTES):
        while block:
            out = stream.decompress(block)
            pending = True
            if out:
                yield out
            if stream.eof:
                block, stream, pending = stream.unused_data, decompressor.decompressobj(), False
            else:
                block = b""
    if pending:
        raise EOFError("the stream ends inside a zstd frame (truncated file)")


def _split_lines(blocks: Iterator[bytes]) -> Iterator[bytes]:
    carry = b""
    for block in blocks:
        pieces = (carry + block).split(b"\n")
        carry = pieces.pop()
        yield from pieces
    if carry:
        yield carry


def _plain_lines(handle: BinaryIO) -> Iterator[bytes]:
    return (line.rstrip(b"\n") for line in handle)


def _gzip_lines(handle: BinaryIO) -> Iterator[bytes]:
    return (line.rstrip(b"\n") for line in gzip.GzipFile(fileobj=handle))


def _zstd_lines(handle: BinaryIO) -> Iterator[bytes]:
    return _split_lines(_zstd_blocks(handle))


def _stream_errors() -> tuple[type[BaseException], ...]:
    errors: tuple[type[BaseException], ...] = (EOFError, OSError, zlib.error)
    try:
        import zstandard

        errors += (zstandard.ZstdError,)
    except ImportError:
        pass
    return errors


def _jsonl_reader(lines: Callable[[BinaryIO], Iterator[bytes]]) -> ShardReader:
    """The reader of JSON Lines whose bytes `lines` splits (after decompressing, if need be)."""

    def read(reading: ShardReading) -> Iterator[str]:
        path = reading.path
        kind = path.rsplit(".", 1)[-1]
        stream_errors = _stream_errors()
        number = 0
        with open(path, "rb") as handle:
            raw_lines = lines(handle)
            while True:
                try:
                    raw = next(raw_lines)
                except StopIteration:
                    break
                except stream_errors as err:
                    reading.bad(
                        f"{path}:{number + 1}",
                        "corrupt-stream",
                        f"corrupt or truncated .{kind} stream after line {number} ({type(err).__name__}: {err})",
                    )
                    return
                number += 1
                if not reading.drawn():
                    continue
                where = f"{path}:{number}"
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as err:
                    reading.bad(where, "not-utf8", f"not UTF-8 ({err.reason} at byte {err.start})")
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as err:
                    reading.bad(where, "bad-json", f"bad JSON: {err.msg} at column {err.colno}")
                    continue
                text = reading.text(record, where)
                if text is not None:
                    yield text
        if number == 0:
            reading.bad(f"{path}:1", "empty-shard", "empty shard: no line at all")

    return read


# --------------------------------------------------------------------------- parquet


def _parquet_texts(reading: ShardReading) -> Iterator[str]:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as err:
        raise ShardError("reading .parquet shards needs pyarrow: pip install 'longctx[corpora]'") from err
    path, text_key, keep = reading.path, reading.text_key, reading.keep
    row = 0
    try:
        table = pq.ParquetFile(path)
        names = table.schema_arrow.names
        columns = {key if key in names else key.split(".")[0] for key in [text_key, *([keep.key] if keep else [])]}
        if text_key not in names and text_key.split(".")[0] not in names:
            reading.bad(path, "missing-key", f"no column {text_key!r} (columns: {names[:8]})")
            return
        for batch in table.iter_batches(columns=sorted(columns & set(names)), batch_size=PARQUET_BATCH_ROWS):
            for record in batch.to_pylist():
                if reading.drawn():
                    text = reading.text(record, f"{path}:row {row}")
                    if text is not None:
                        yield text
                row += 1
    except (pa.ArrowException, OSError) as err:
        reading.bad(f"{path}:row {row}", "unreadable", f"pyarrow cannot read the file from row {row} on: {err}")
        return
    if row == 0:
        reading.bad(f"{path}:row 0", "empty-shard", "empty shard: no row at all")


# --------------------------------------------------------------------------- the formats

SHARD_READERS: dict[str, ShardReader] = {
    ".jsonl": _jsonl_reader(_plain_lines),
    ".jsonl.zst": _jsonl_reader(_zstd_lines),
    ".jsonl.gz": _jsonl_reader(_gzip_lines),
    ".parquet": _parquet_texts,
}
"""Every corpus format, by the suffix that names it: the one place a format is added."""

SHARD_SUFFIXES = tuple(SHARD_READERS)
