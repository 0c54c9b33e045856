"""`longctx prepare` over sharded corpora, on one node or several, resumable.

    longctx prepare data/slimpajama/train OUT --tokenizer llama3 --workers 16 \\
        --drop meta.redpajama_set_name=RedPajamaGithub                       # one node
    longctx prepare 'corpus/**/*.parquet' OUT --tokenizer llama3 --workers 16 --node-rank K --nodes N
    longctx prepare --join OUT --nodes N                                     # once all N are done

Work. The shards (data/shard_reader.py: sorted, stable) are dealt out by node: node K of N takes
shards K, K + N, K + 2N, ... It tokenises them in rounds of `--workers` shards, one shard
per litdata worker; each worker streams its shard's records (data/shard_reader.py) through the
tokenizer in batches of about `BATCH_CHARS` characters (`encode_batch` on one thread per
worker: `TOKENIZERS_PARALLELISM=false` in the workers, so N workers use N cores) and yields
one int32 array per document, its token ids then EOS, into litdata's chunk writer. Nothing
holds more than one batch of text per worker.

Layout. Node K writes `OUT/parts/node-K-of-N/`: one litdata dataset per round
(`round-00000/`, with its `lengths.npy` and `round.json`: the round's shards and chunks)
and the node's ledger `part.json` (the plan, the finished rounds, and whether the node
is done). A one-node run joins its part into OUT itself; with several nodes `--join`
merges every node's rounds into OUT (litdata's `merge_datasets`, chunks copied and
renamed), after checking that the parts are complete, disjoint and together cover every
shard. OUT then holds what `data.path` trains on: chunks, `index.json`, `lengths.npy` and
`prepare.json`, whose `shards` list records each input shard's name, size, SHA-256, and
its document, token, filtered and skipped counts. The parts may be deleted after the join.

Resume. The ledger is rewritten after every finished round, so a killed run started again
with the same command redoes only the round it was in (at most `--workers` shards); a
ledger written with another tokenizer, filter, text key, bad-input policy or shard list is
an error rather than a mixed dataset.

Progress. After each round: shards done of this node's total, tokens, tokens/s over this
run, and the time left estimated from the shard bytes still to read.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from litdata import StreamingDataset, optimize

from longctx.data import storage
from longctx.data.corpus import format_length_report, length_report
from longctx.data.integrity import INDEX_FILE, MANIFEST_FILE, item_count, record_chunks
from longctx.data.packing import LENGTHS_FILE
from longctx.data.shard_reader import (
    EXAMPLES_KEPT,
    CorpusReport,
    MetadataFilter,
    Shard,
    find_shards,
    shard_texts,
)
from longctx.data.tokenizer import Tokenizer
from longctx.errors import DataError

PARTS_DIR = "parts"
PART_FILE = "part.json"
ROUND_FILE = "round.json"
BATCH_CHARS = 1 << 20
"""Characters of text tokenised per `encode_batch` call in a worker (bounds its memory)."""


def part_dir(output_dir: str | Path, node_rank: int, nodes: int) -> str:
    return storage.join(storage.join(output_dir, PARTS_DIR), f"node-{node_rank}-of-{nodes}")


@dataclass
class TokenizeShards:
    """The per-input function litdata runs in its workers: input i is shard `paths[i]`;
    yields one int32 array per document and leaves the shard's counts in `stats_dir`."""

    tokenizer_spec: str
    paths: list[str]
    text_key: str
    keep: MetadataFilter | None
    on_bad_input: str
    stats_dir: str

    def __call__(self, index: int) -> Iterator[np.ndarray]:
        os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread per worker: N workers, N cores
        from longctx.data.prepare import _worker_tokenizer

        tokenizer = _worker_tokenizer(self.tokenizer_spec)
        path = self.paths[index]
        counts = CorpusReport(examples_kept=EXAMPLES_KEPT)
        tokens, batch, size, started = 0, [], 0, time.monotonic()
        try:
            for text in shard_texts(
                path, text_key=self.text_key, keep=self.keep, on_bad_input=self.on_bad_input, counts=counts
            ):
                batch.append(text)
                size += len(text)
                if size >= BATCH_CHARS:
                    for ids in _encode(tokenizer, batch):
                        tokens += len(ids)
                        yield ids
                    batch, size = [], 0
            for ids in _encode(tokenizer, batch):
                tokens += len(ids)
                yield ids
        except DataError as error:  # the main process raises it again, naming shard and line
            Path(self.stats_dir, f"error-{index}.txt").write_text(str(error))
            raise
        record = {
            "documents": counts.documents,
            "tokens": tokens,
            "filtered": counts.filtered,
            "skipped": counts.count_by_kind(),
            "examples": [vars(rejection) for rejection in counts.rejections],
            "sha256": storage.file_sha256(path),
            "seconds": round(time.monotonic() - started, 3),
        }
        Path(self.stats_dir, f"shard-{index}.json").write_text(json.dumps(record))


def _encode(tokenizer: Tokenizer, texts: list[str]) -> Iterator[np.ndarray]:
    if not texts:
        return
    eos = tokenizer.eos_id
    for ids in tokenizer.encode_batch(texts):
        out = np.empty(len(ids) + 1, dtype=np.int32)
        out[:-1] = ids
        out[-1] = eos
        yield out


def corpus_fingerprint(shards: Sequence[Shard]) -> str:
    """SHA-256 over the ordered shard names and sizes: every node must see the same list."""
    return hashlib.sha256(json.dumps([[s.name, s.bytes] for s in shards]).encode()).hexdigest()


def _format_duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s"


def _run_round(
    directory: str, shards: list[Shard], plan: dict, tokenizer_spec: str, keep: MetadataFilter | None, chunk_bytes: str
) -> dict:
    """Tokenise `shards` (one per worker) into the litdata dataset `directory`; returns its round.json."""
    if not storage.is_remote(directory) and Path(directory).exists():
        shutil.rmtree(directory)  # what a killed round left
    with tempfile.TemporaryDirectory(prefix="longctx-round-") as stats_dir:
        fn = TokenizeShards(
            tokenizer_spec, [s.path for s in shards], plan["text_key"], keep, plan["on_bad_input"], stats_dir
        )
        try:
            optimize(
                fn=fn,
                inputs=list(range(len(shards))),
                weights=[max(s.bytes, 1) for s in shards],
                output_dir=str(directory),
                chunk_bytes=chunk_bytes,
                num_workers=len(shards),
                mode="overwrite",
                verbose=False,
                start_method="fork",  # workers inherit the loaded tokenizer module
            )
        except Exception as error:
            _raise_worker_error(stats_dir, shards)
            raise DataError(f"preparing shards {[s.name for s in shards]} failed: {error}") from error
        _raise_worker_error(stats_dir, shards)  # litdata may log a worker's failure and return
        records = []
        for index, shard in enumerate(shards):
            stats_file = Path(stats_dir, f"shard-{index}.json")
            if not stats_file.exists():
                raise DataError(f"{shard.path}: its worker ended without finishing the shard")
            records.append({"name": shard.name, "bytes": shard.bytes, **json.loads(stats_file.read_text())})
    documents = sum(r["documents"] for r in records)
    if documents:
        written = StreamingDataset(str(directory), shuffle=False)
        lengths = np.asarray([len(written[i]) for i in range(item_count(written))], dtype=np.int64)
        chunks = record_chunks(directory)
    else:
        lengths, chunks = np.zeros(0, dtype=np.int64), []
    if len(lengths) != documents or int(lengths.sum()) != sum(r["tokens"] for r in records):
        raise DataError(
            f"{directory}: litdata holds {len(lengths)} items of {int(lengths.sum())} tokens, but the workers "
            f"wrote {documents} documents of {sum(r['tokens'] for r in records)} tokens"
        )
    storage.write_array(storage.join(directory, LENGTHS_FILE), lengths)
    summary = {"shards": records, "chunks": chunks, "documents": documents, "tokens": int(lengths.sum())}
    storage.write_json(storage.join(directory, ROUND_FILE), summary)
    return summary


def _raise_worker_error(stats_dir: str, shards: list[Shard]) -> None:
    for index in range(len(shards)):
        error_file = Path(stats_dir, f"error-{index}.txt")
        if error_file.exists():
            raise DataError(error_file.read_text())


def prepare_shards(
    sources: Sequence[str],
    output_dir: str | Path,
    tokenizer_spec: str,
    *,
    text_key: str = "text",
    keep: MetadataFilter | None = None,
    on_bad_input: str = "error",
    num_workers: int = 1,
    node_rank: int = 0,
    nodes: int = 1,
    chunk_bytes: str = "64MB",
    verbose: bool = True,
) -> dict:
    """Prepare this node's share of the shards under `sources` (see the module docstring);
    returns OUT's manifest after a one-node run, else this node's ledger."""
    if nodes < 1 or not 0 <= node_rank < nodes:
        raise DataError(f"--node-rank {node_rank} --nodes {nodes}: need nodes >= 1 and 0 <= node-rank < nodes")
    if num_workers < 1:
        raise DataError(f"--workers {num_workers}: need at least one worker")
    output_dir = str(output_dir)
    from longctx.data.prepare import _worker_tokenizer, finished_manifest

    tokenizer = _worker_tokenizer(tokenizer_spec)  # loaded once: the forked workers inherit it
    manifest = finished_manifest(output_dir, tokenizer)
    if manifest is not None:
        return manifest
    shards = find_shards(sources)
    mine = shards[node_rank::nodes]
    plan = {
        "sources": list(sources),
        "shards_total": len(shards),
        "corpus_fingerprint": corpus_fingerprint(shards),
        "nodes": nodes,
        "node_rank": node_rank,
        "assigned": [s.name for s in mine],
        "tokenizer": tokenizer.name,
        "tokenizer_fingerprint": tokenizer.fingerprint,
        "eos_id": tokenizer.eos_id,
        "vocab_size": tokenizer.vocab_size,
        "text_key": text_key,
        "filter": None if keep is None else {"key": keep.key, "values": sorted(keep.values), "keep": keep.keep},
        "on_bad_input": on_bad_input,
    }
    part = part_dir(output_dir, node_rank, nodes)
    ledger_path = storage.join(part, PART_FILE)
    ledger = storage.read_json_or_none(ledger_path) or {"plan": plan, "rounds": [], "complete": False}
    changed = [key for key in plan if ledger["plan"].get(key) != plan[key] and key != "sources"]
    if changed:
        raise DataError(
            f"{ledger_path} was started with other settings ({', '.join(changed)} differ); "
            "rerun with the same command or choose another output directory"
        )
    done = {name for entry in ledger["rounds"] for name in entry["shards"]}
    todo = [s for s in mine if s.name not in done]
    if verbose:
        print(
            f"prepare: node {node_rank} of {nodes}: {len(mine)} of {len(shards)} shards "
            f"({sum(s.bytes for s in mine) / 1e9:.2f} GB), {len(done)} already done; {num_workers} workers"
        )
    started, tokens_now, bytes_now = time.monotonic(), 0, 0
    bytes_left = sum(s.bytes for s in todo)
    for first in range(0, len(todo), num_workers):
        group = todo[first : first + num_workers]
        name = f"round-{len(ledger['rounds']):05d}"
        summary = _run_round(storage.join(part, name), group, plan, tokenizer_spec, keep, chunk_bytes)
        ledger["rounds"].append(
            {
                "dir": name,
                "shards": [s.name for s in group],
                "documents": summary["documents"],
                "tokens": summary["tokens"],
            }
        )
        storage.write_json(ledger_path, ledger)
        tokens_now += summary["tokens"]
        bytes_now += sum(s.bytes for s in group)
        bytes_left -= sum(s.bytes for s in group)
        if verbose:
            elapsed = time.monotonic() - started
            left = bytes_left / (bytes_now / elapsed) if bytes_now else 0.0
            print(
                f"prepare: {len(done) + first + len(group)}/{len(mine)} shards, {tokens_now:,} tokens this run, "
                f"{tokens_now / elapsed / 1e6:.2f}M tokens/s, ~{_format_duration(left)} left",
                flush=True,
            )
    ledger["complete"] = True
    storage.write_json(ledger_path, ledger)
    if nodes == 1:
        return join_parts(output_dir, 1, verbose=verbose)
    if verbose:
        print(
            f"prepare: node {node_rank} of {nodes} done; once every node is, run `longctx prepare --join {output_dir} --nodes {nodes}`"
        )
    return ledger


def _merge(round_dirs: list[str], output_dir: str) -> None:
    """litdata's merge_datasets (it needs two inputs or more; one is copied the same way)."""
    if len(round_dirs) > 1:
        from litdata.processing.functions import merge_datasets

        merge_datasets(round_dirs, output_dir, max_workers=4)
        return
    index = storage.read_json(storage.join(round_dirs[0], INDEX_FILE))
    for number, chunk in enumerate(index["chunks"]):
        new_name = f"chunk-0-{number}.bin"
        storage.copy(storage.join(round_dirs[0], chunk["filename"]), storage.join(output_dir, new_name))
        chunk["filename"] = new_name
    storage.write_bytes(storage.join(output_dir, INDEX_FILE), json.dumps(index).encode())


def _round_summary(directory: str) -> dict:
    summary = storage.read_json_or_none(storage.join(directory, ROUND_FILE))
    if summary is None:
        raise DataError(f"{directory}: no {ROUND_FILE}; the part's ledger names a round that is not there")
    return summary


def join_parts(output_dir: str | Path, nodes: int, *, verbose: bool = True) -> dict:
    """Merge the parts of all `nodes` nodes into one dataset at `output_dir`; returns its manifest."""
    output_dir = str(output_dir)
    ledgers = []
    for rank in range(nodes):
        ledger = storage.read_json_or_none(storage.join(part_dir(output_dir, rank, nodes), PART_FILE))
        if ledger is None or not ledger.get("complete"):
            state = "is missing" if ledger is None else "is not finished"
            raise DataError(
                f"{part_dir(output_dir, rank, nodes)}: node {rank} of {nodes}'s part {state}; "
                f"run `longctx prepare ... --node-rank {rank} --nodes {nodes}` to completion first"
            )
        ledgers.append(ledger)
    plan = ledgers[0]["plan"]
    for rank, ledger in enumerate(ledgers):
        for key in ("corpus_fingerprint", "tokenizer_fingerprint", "text_key", "filter", "on_bad_input"):
            if ledger["plan"][key] != plan[key]:
                raise DataError(f"node {rank}'s part was prepared with another {key} than node 0's")
    assigned = [name for ledger in ledgers for name in ledger["plan"]["assigned"]]
    prepared = [name for ledger in ledgers for entry in ledger["rounds"] for name in entry["shards"]]
    if (
        len(set(prepared)) != len(prepared)
        or sorted(prepared) != sorted(assigned)
        or len(assigned) != plan["shards_total"]
    ):
        raise DataError(
            f"the parts under {storage.join(output_dir, PARTS_DIR)} do not cover the {plan['shards_total']} shards "
            f"exactly once ({len(prepared)} prepared, {len(set(prepared))} distinct)"
        )
    rounds = [
        storage.join(part_dir(output_dir, rank, nodes), entry["dir"])
        for rank, ledger in enumerate(ledgers)
        for entry in ledger["rounds"]
        if entry["documents"]
    ]
    summaries = [_round_summary(directory) for directory in rounds]
    all_shards = [
        record
        for rank, ledger in enumerate(ledgers)
        for entry in ledger["rounds"]
        for record in _round_summary(storage.join(part_dir(output_dir, rank, nodes), entry["dir"]))["shards"]
    ]
    if not rounds:
        raise DataError(f"the shards under {plan['sources']} yielded no usable document")
    _merge(rounds, output_dir)
    lengths = np.concatenate([storage.read_array(storage.join(directory, LENGTHS_FILE)) for directory in rounds])
    storage.write_array(storage.join(output_dir, LENGTHS_FILE), lengths)
    merged_index = storage.read_json(storage.join(output_dir, INDEX_FILE))
    chunk_records = [chunk for summary in summaries for chunk in summary["chunks"]]
    if len(chunk_records) != len(merged_index["chunks"]):
        raise DataError(
            f"{output_dir}: merged {len(merged_index['chunks'])} chunks, the parts recorded {len(chunk_records)}"
        )
    chunks = [
        {**record, "file": chunk["filename"]}
        for record, chunk in zip(chunk_records, merged_index["chunks"], strict=True)
    ]
    skipped: Counter = Counter()
    examples: list[dict] = []
    for record in all_shards:
        skipped.update(record["skipped"])
        examples += record["examples"][: max(EXAMPLES_KEPT - len(examples), 0)]
    manifest = {
        "source": " ".join(plan["sources"]),
        "tokenizer": plan["tokenizer"],
        "tokenizer_fingerprint": plan["tokenizer_fingerprint"],
        "eos_id": plan["eos_id"],
        "vocab_size": plan["vocab_size"],
        "documents": len(lengths),
        "tokens": int(lengths.sum()),
        "filtered": sum(r["filtered"] for r in all_shards),
        "rejected": dict(skipped),
        "rejected_items": examples,
        "text_key": plan["text_key"],
        "filter": plan["filter"],
        "on_bad_input": plan["on_bad_input"],
        "nodes": nodes,
        "shards": [{k: v for k, v in r.items() if k != "examples"} for r in all_shards],
        "lengths": length_report(lengths),
        "chunks": chunks,
        "complete": True,
    }
    storage.write_json(storage.join(output_dir, MANIFEST_FILE), manifest)
    if verbose:
        print(format_length_report(manifest["lengths"]))
        print(
            f"prepare: wrote {manifest['tokens']:,} tokens in {manifest['documents']:,} documents from "
            f"{len(all_shards)} shards to {output_dir}; skipped {dict(skipped) or 'none'}, filtered {manifest['filtered']}"
        )
    return manifest
