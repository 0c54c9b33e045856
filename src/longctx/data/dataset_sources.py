"""Resolve `data.path` / `data.mixture` to prepared dataset directories.

A mixture source of kind `retrieval` (data/retrieval.py) is generated and prepared on first
use, into its `path` or, when that is '', into `$LONGCTX_CACHE/data/retrieval-<key>` keyed
by its settings and the tokenizer fingerprint; its manifest carries its distance report.

An empty `data.path` means the embedded corpus: it is prepared on first use into
`$LONGCTX_CACHE/data/embedded-<tokenizer fingerprint>` (default `~/.cache/longctx`), once
per machine. Under torchrun, local rank 0 prepares while the other ranks wait for its
manifest, so a multi-process launch never tokenises twice or reads half-written chunks.
Separate launches on one machine (two `longctx pretrain` commands, a sweep's agents) take
an exclusive file lock beside the directory, so only the first prepares and the others
wait for it and then read the finished dataset.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

from longctx.config import DataSource, ExperimentConfig
from longctx.data import storage
from longctx.data.answer_spans import ANSWERS_FILE, answer_table, write_answers
from longctx.data.integrity import verify_dataset
from longctx.data.packing import LENGTHS_FILE
from longctx.data.prepare import check_dataset, prepare, read_manifest
from longctx.data.retrieval import answer_distances, retrieval_documents, retrieval_report
from longctx.data.tokenizer import Tokenizer, default_cache_dir
from longctx.errors import ConfigError

WAIT_FOR_PREPARE_S = 3600


def embedded_dataset_dir(tokenizer: Tokenizer) -> Path:
    return default_cache_dir().parent / "data" / f"embedded-{tokenizer.fingerprint[:16]}"


REPORT_WINDOWS = (256, 512, 1024, 2048, 4096)

KEYED_ONLY_WHEN_SET = {"filler_tail": 0.0}
"""Retrieval settings added after caches existed, with the default that generates the same documents."""


def retrieval_dataset_dir(source: DataSource, tokenizer: Tokenizer) -> Path:
    """Cache directory of a generated retrieval source: keyed by its settings and the tokenizer.
    A setting added later is left out of the key at its default value, so the caches written
    before it existed (the same documents) stay valid."""
    fields = asdict(source.retrieval)
    for name, default in KEYED_ONLY_WHEN_SET.items():
        if fields[name] == default:
            del fields[name]
    settings = json.dumps(fields, sort_keys=True)
    key = hashlib.sha256(f"{settings}|{tokenizer.fingerprint}".encode()).hexdigest()[:16]
    return default_cache_dir().parent / "data" / f"retrieval-{key}"


def prepare_retrieval(source: DataSource, directory: Path, tokenizer: Tokenizer, spec: str) -> dict:
    """Generate and tokenise a retrieval source; its manifest holds the settings and the
    needle-question distance report (`retrieval_report`: what each window can train)."""
    distances = answer_distances(tokenizer, source.retrieval)
    extra = {"retrieval": asdict(source.retrieval), "retrieval_report": retrieval_report(distances, REPORT_WINDOWS)}
    manifest = prepare("retrieval", directory, spec, documents=retrieval_documents(source.retrieval), extra=extra)
    # Where each answer and its fact are (data/answer_spans.py), written after the tokens; a
    # source prepared before this file existed gets it here on its next use.
    lengths = storage.read_array(storage.join(directory, LENGTHS_FILE))
    write_answers(directory, answer_table(source.retrieval, tokenizer, lengths))
    return manifest


def _retrieval_ready(directory: Path) -> bool:
    """A generated source is ready when its tokens are complete and its answer spans written."""
    return bool((read_manifest(directory) or {}).get("complete")) and storage.exists(
        storage.join(directory, ANSWERS_FILE)
    )


@contextlib.contextmanager
def _exclusive(directory: Path) -> Iterator[None]:
    """Hold an exclusive lock on `<parent>/.<name>.lock` (local directories only): without it
    two processes tokenise into the same directory and one reads the other's half-written
    litdata index (which `optimize` reports as a JSONDecodeError)."""
    if storage.is_remote(directory):
        yield
        return
    lock_path = Path(directory).parent / f".{Path(directory).name}.lock"
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _prepare_once(directory: Path, tokenizer: Tokenizer, spec: str, source: DataSource | None = None) -> None:
    if int(os.environ.get("LOCAL_RANK", "0")) == 0:
        with _exclusive(directory):
            if source is None:
                prepare("embedded", directory, spec)
            elif not _retrieval_ready(directory):
                prepare_retrieval(source, directory, tokenizer, spec)
        return
    deadline = time.monotonic() + WAIT_FOR_PREPARE_S
    while not (_retrieval_ready(directory) if source else (read_manifest(directory) or {}).get("complete")):
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up waiting for local rank 0 to prepare {directory}")
        time.sleep(2)


def prepared_sources(config: ExperimentConfig, tokenizer: Tokenizer) -> list[tuple[str, float]]:
    """[(directory, weight)] for training, each checked against the tokenizer."""
    data = config.data
    if tokenizer.vocab_size > config.model.vocab_size:
        raise ConfigError(
            "data.tokenizer",
            f"{tokenizer.name} has {tokenizer.vocab_size} tokens but model.vocab_size is {config.model.vocab_size}",
        )
    if data.mixture:
        sources = []
        for source, weight in zip(data.mixture, data.source_weights(), strict=True):
            path = source.path
            if source.kind == "retrieval":
                directory = Path(path) if path else retrieval_dataset_dir(source, tokenizer)
                _prepare_once(directory, tokenizer, data.tokenizer, source)
                path = str(directory)
            sources.append((path, weight))
    elif data.path:
        sources = [(data.path, 1.0)]
    else:
        directory = embedded_dataset_dir(tokenizer)
        _prepare_once(directory, tokenizer, data.tokenizer)
        sources = [(str(directory), 1.0)]
    for path, _ in sources:
        if not storage.is_remote(path) and not Path(path).exists():
            raise FileNotFoundError(f"data directory {path} does not exist; run `longctx prepare SOURCE {path}`")
        check_dataset(path, tokenizer)
        if data.verify == "full":  # sizes are checked whenever a dataset is opened (PackedSource)
            verify_dataset(path, "full")
    return sources
