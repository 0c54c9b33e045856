"""Resolve `data.path` / `data.mixture` to prepared dataset directories.

An empty `data.path` means the embedded corpus: it is prepared on first use into
`$LONGCTX_CACHE/data/embedded-<tokenizer fingerprint>` (default `~/.cache/longctx`), once
per machine. Under torchrun, local rank 0 prepares while the other ranks wait for its
manifest, so a multi-process launch never tokenises twice or reads half-written chunks.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from longctx.errors import ConfigError
from longctx.config import ExperimentConfig
from longctx.data.prepare import check_dataset, prepare, read_manifest
from longctx.data.tokenizer import Tokenizer, default_cache_dir

WAIT_FOR_PREPARE_S = 3600


def embedded_dataset_dir(tokenizer: Tokenizer) -> Path:
    return default_cache_dir().parent / "data" / f"embedded-{tokenizer.fingerprint[:16]}"


def _prepare_once(directory: Path, tokenizer: Tokenizer, spec: str) -> None:
    if int(os.environ.get("LOCAL_RANK", "0")) == 0:
        prepare("embedded", directory, spec)
        return
    deadline = time.monotonic() + WAIT_FOR_PREPARE_S
    while not (read_manifest(directory) or {}).get("complete"):
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up waiting for local rank 0 to prepare {directory}")
        time.sleep(2)


def prepared_sources(config: ExperimentConfig, tokenizer: Tokenizer) -> list[tuple[str, float]]:
    """[(directory, weight)] for training, each checked against the tokenizer."""
    data = config.data
    if tokenizer.vocab_size > config.model.vocab_size:
        raise ConfigError(
            "data.tokenizer", f"{tokenizer.name} has {tokenizer.vocab_size} tokens but model.vocab_size is "
            f"{config.model.vocab_size}"
        )
    if data.mixture:
        sources = [(source.path, source.weight) for source in data.mixture]
    elif data.path:
        sources = [(data.path, 1.0)]
    else:
        directory = embedded_dataset_dir(tokenizer)
        _prepare_once(directory, tokenizer, data.tokenizer)
        sources = [(str(directory), 1.0)]
    for path, _ in sources:
        if "://" not in path and not Path(path).exists():
            raise FileNotFoundError(f"data directory {path} does not exist; run `longctx prepare SOURCE {path}`")
        if "://" not in path:
            check_dataset(path, tokenizer)
    return sources
