"""`longctx prepare`: tokenise documents into a litdata-optimized dataset.

    longctx prepare embedded data/embedded-bpe8192 --tokenizer bpe-8192
    longctx prepare corpus.jsonl data/mine --tokenizer llama3 --workers 8

Each document becomes one item: its token ids followed by EOS (int32). Beside litdata's
chunks and index.json the directory holds

    lengths.npy    tokens per item, in item order (what data/packing.py lays end to end)
    prepare.json   the manifest: source, tokenizer name and fingerprint, EOS id, counts,
                   rejected items with reasons, the document-length report, and every
                   chunk's size and SHA-256 (checked on open: data/integrity.py)

The output may be an object-store prefix (`longctx prepare corpus.jsonl s3://bucket/data`):
litdata uploads the chunks and the side files go through the same storage layer
(`data/storage.py`).

Shards are read by data/shard_reader.py under `on_bad_input`: a bad line stops the run
naming file and line, or with "skip" is counted in the manifest and printed; an unusable
document of a bundled source (undecodable file, empty text) is counted and printed. Nothing
is dropped silently. The run is resumable: litdata's `use_checkpoint` keeps per-worker
progress, and a directory whose manifest says it is complete is left alone. Training
refuses a dataset whose tokenizer fingerprint differs from the configured tokenizer's.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from litdata import StreamingDataset, optimize

from longctx.data import storage
from longctx.data.corpus import CorpusReport, Document, format_length_report, length_report, source_texts
from longctx.data.integrity import MANIFEST_FILE, item_count, record_chunks
from longctx.data.packing import LENGTHS_FILE
from longctx.data.tokenizer import Tokenizer, load_tokenizer
from longctx.errors import DataError


@dataclass
class TokenizeDocument:
    """The per-item function litdata runs in its workers (picklable: holds only the spec)."""

    tokenizer_spec: str

    def __call__(self, text: str) -> np.ndarray:
        tokenizer = _worker_tokenizer(self.tokenizer_spec)
        return np.asarray([*tokenizer.encode(text), tokenizer.eos_id], dtype=np.int32)


_TOKENIZERS: dict[str, Tokenizer] = {}


def _worker_tokenizer(spec: str) -> Tokenizer:
    if spec not in _TOKENIZERS:
        _TOKENIZERS[spec] = load_tokenizer(spec)
    return _TOKENIZERS[spec]


def read_manifest(directory: str | Path) -> dict | None:
    return storage.read_json_or_none(storage.join(directory, MANIFEST_FILE))


def finished_manifest(directory: str | Path, tokenizer: Tokenizer) -> dict | None:
    """The manifest of a completely prepared `directory` (None when it is not), which must
    have been prepared with `tokenizer`: preparing it again would change nothing."""
    manifest = read_manifest(directory)
    if manifest is None or not manifest.get("complete"):
        return None
    if manifest["tokenizer_fingerprint"] != tokenizer.fingerprint:
        raise DataError(f"{directory} was prepared with tokenizer {manifest['tokenizer']}; choose another directory")
    return manifest


def prepare(
    source: str,
    output_dir: str | Path,
    tokenizer_spec: str,
    *,
    num_workers: int = 1,
    chunk_bytes: str = "64MB",
    verbose: bool = True,
    documents: Iterable[Document] | None = None,
    extra: dict | None = None,
    on_bad_input: str = "error",
) -> dict:
    """Tokenise `source` (see corpus.source_texts) into `output_dir` (a local directory or an
    object-store prefix such as `s3://bucket/data`); returns the manifest.

    `documents`, when given, replaces `source_texts(source)` (generated sources such as
    data/retrieval.py; `source` then only names them in the manifest); `extra` is merged
    into the manifest (a generated source's settings and its own report).
    """
    output_dir = str(output_dir) if storage.is_remote(output_dir) else Path(output_dir)
    tokenizer = load_tokenizer(tokenizer_spec)
    manifest = finished_manifest(output_dir, tokenizer)
    if manifest is not None:
        return manifest

    report = CorpusReport()
    if documents is None:
        texts = list(source_texts(source, report, on_bad_input=on_bad_input))
    else:
        texts = [document.text for document in documents]
    if not texts:
        raise DataError(f"data source {source!r} yielded no usable document\n{report.summary()}")
    if verbose:
        print(f"prepare: {len(texts)} documents from {source or 'embedded'}; {report.summary()}")
    optimize(
        fn=TokenizeDocument(tokenizer_spec),
        inputs=texts,
        output_dir=str(output_dir),
        chunk_bytes=chunk_bytes,
        num_workers=num_workers,
        use_checkpoint=True,
        verbose=False,  # litdata's own lines (an advertisement, worker chatter); ours say what was written
        start_method="fork",  # workers inherit the loaded tokenizer module; no re-import of __main__
    )
    written = StreamingDataset(str(output_dir), shuffle=False)
    lengths = np.asarray([len(written[i]) for i in range(item_count(written))], dtype=np.int64)
    storage.write_array(storage.join(output_dir, LENGTHS_FILE), lengths)
    manifest = {
        "source": source or "embedded",
        "tokenizer": tokenizer.name,
        "tokenizer_fingerprint": tokenizer.fingerprint,
        "eos_id": tokenizer.eos_id,
        "vocab_size": tokenizer.vocab_size,
        "documents": len(lengths),
        "tokens": int(lengths.sum()),
        "rejected": report.count_by_kind(),
        "rejected_items": [vars(r) for r in report.rejections],
        "lengths": length_report(lengths),
        "chunks": record_chunks(output_dir),  # size and SHA-256 of each (data/integrity.py)
        **(extra or {}),
        "complete": True,
    }
    storage.write_json(storage.join(output_dir, MANIFEST_FILE), manifest)
    if verbose:
        print(format_length_report(manifest["lengths"]))
        print(f"prepare: wrote {manifest['tokens']:,} tokens in {manifest['documents']:,} documents to {output_dir}")
    return manifest


def check_dataset(directory: str | Path, tokenizer: Tokenizer) -> dict:
    """The manifest of a prepared dataset, after checking it matches `tokenizer`."""
    manifest = read_manifest(directory)
    if manifest is None or not manifest.get("complete"):
        raise FileNotFoundError(
            f"{directory} is not a completely prepared dataset (no complete {MANIFEST_FILE}); run `longctx prepare`"
        )
    if manifest["tokenizer_fingerprint"] != tokenizer.fingerprint:
        raise DataError(
            f"{directory} was tokenised with {manifest['tokenizer']} (fingerprint {manifest['tokenizer_fingerprint'][:12]}), "
            f"but data.tokenizer is {tokenizer.name} ({tokenizer.fingerprint[:12]})"
        )
    return manifest
