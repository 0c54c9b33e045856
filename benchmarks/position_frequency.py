"""Cost of the f(i) probe per batch, against a `tiny` training step and a brute-force pair count.

Launch from the repository root:

    .venv/bin/python benchmarks/position_frequency.py [--seq-len 4096] [--rows 1 2 3 4]
                                                      [--repeats 3] [--counter-repeats 20]

What it measures, for micro-batches of 1..4 rows of T tokens:

- rows packed from documents whose lengths follow the embedded corpus: a random stdlib
  `.py` file's size in bytes / 3.5 chars per token (at least 16 tokens), concatenated
  until the row is full, the last one cut at T (fixed seed); `labels` are -100 on the
  last token of every document (its next token belongs to another document);
- three kinds of position ids over the same documents:
  `contiguous`  0..n-1 per document (doc_mask=true packing);
  `skipalign`   SkipAlign-like: each document cut into segments of U{32..512} tokens whose
                ids jump forward by a random skip at every cut (total ids up to 4T), with
                every other segment a masked "prompt" (labels -100), so query runs and key
                runs differ;
  `randpos`     RandPos-like, the counter's worst case: n sorted distinct ids drawn from
                [0, 4n), runs of ~1 token, so O(R^2) approaches the O(n^2) brute force;
- `counter ms`: `PositionFrequency.update` on the batch (both histograms and validation;
  max_distance T for contiguous ids, 4T otherwise), median of `--counter-repeats` calls
  after one warm-up, with torch's default threads as a training process would call it,
  and again with `torch.set_num_threads(1)` (`1 thread`): on a machine whose cores are
  busy with other work, torch's parallel kernels can stall for tens of ms, and the
  one-thread time shows the counter's own work;
- `brute ms`: every (query, key) pair materialised per row as a [T, T] distance matrix
  and masked (same document, key not after query, labelled query), then bincount; its
  result must equal the counter's or the script aborts;
- `step ms`: forward + cross-entropy + backward of `Llama(ModelConfig.from_preset("tiny"))`
  with `attention_backend="varlen"` on the contiguous batch (float32, CPU, torch's default
  threads), median of `--repeats` steps after one warm-up. The step's cost does not depend
  on the id values, so the same step time is the denominator for all three kinds. The
  optimizer step is left out: the ratio is an upper bound on the share of a real step.

The issue's goal: the probe costs < 1% of a training step.
"""

from __future__ import annotations

import argparse
import functools
import random
import statistics
import sysconfig
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from longctx.config.model import ModelConfig
from longctx.model.llama import Llama
from longctx.probes.position_frequency import IGNORE_INDEX, PositionFrequency

CHARS_PER_TOKEN = 3.5
MIN_DOCUMENT_TOKENS = 16
ID_STRETCH = 4  # gapped ids span up to 4x the tokens they label
SEED = 0
KINDS = ("contiguous", "skipalign", "randpos")


# --- batches ----------------------------------------------------------------------------


def stdlib_document_lengths() -> list[int]:
    """Token length of every stdlib `.py` file, estimated from its size in bytes."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(path for path in root.rglob("*.py") if "site-packages" not in path.relative_to(root).parts)
    return [max(MIN_DOCUMENT_TOKENS, round(path.stat().st_size / CHARS_PER_TOKEN)) for path in files]


def pack_documents(document_lengths: list[int], seq_len: int, rows: int, rng: random.Random) -> list[list[int]]:
    """Per row, the lengths of the documents laid end to end (the last one cut at seq_len)."""
    packed = []
    for _ in range(rows):
        pieces: list[int] = []
        while sum(pieces) < seq_len:
            pieces.append(min(rng.choice(document_lengths), seq_len - sum(pieces)))
        packed.append(pieces)
    return packed


def document_positions(n: int, kind: str, rng: random.Random) -> tuple[list[int], list[bool]]:
    """Position ids of one n-token document and which of its tokens are masked prompt."""
    if kind == "contiguous":
        return list(range(n)), [False] * n
    if kind == "randpos":
        return sorted(rng.sample(range(ID_STRETCH * n), n)), [False] * n
    ids, prompt, next_id, budget, is_prompt = [], [], 0, (ID_STRETCH - 1) * n, True
    while len(ids) < n:
        length = min(rng.randint(32, 512), n - len(ids))
        if ids:
            skip = rng.randint(1, max(1, budget // 2))
            budget -= skip
            next_id += skip
        ids += range(next_id, next_id + length)
        prompt += [is_prompt] * length
        next_id += length
        is_prompt = not is_prompt
    return ids, prompt


def make_batch(packed: list[list[int]], kind: str, rng: random.Random) -> dict[str, torch.Tensor]:
    """The batch contract for documents of the given lengths, ids of the given kind."""
    positions, documents, labels = [], [], []
    for pieces in packed:
        row_positions, row_documents, row_labels = [], [], []
        for document, n in enumerate(pieces):
            ids, prompt = document_positions(n, kind, rng)
            row_positions += ids
            row_documents += [document] * n
            row_labels += [IGNORE_INDEX if masked or i == n - 1 else 1 for i, masked in enumerate(prompt)]
        positions.append(row_positions)
        documents.append(row_documents)
        labels.append(row_labels)
    vocab = ModelConfig.from_preset("tiny").vocab_size
    position_ids = torch.tensor(positions)
    input_ids = torch.randint(vocab, position_ids.shape, generator=torch.Generator().manual_seed(SEED))
    targets = torch.where(torch.tensor(labels) == IGNORE_INDEX, IGNORE_INDEX, input_ids.roll(-1, dims=1))
    document_ids = torch.tensor(documents)
    return {"input_ids": input_ids, "labels": targets, "position_ids": position_ids, "document_ids": document_ids}


def key_runs_per_document(batch: dict[str, torch.Tensor]) -> float:
    pos, doc = batch["position_ids"], batch["document_ids"]
    new_document = torch.ones_like(doc, dtype=torch.bool)
    new_document[:, 1:] = doc[:, 1:] != doc[:, :-1]
    new_run = new_document.clone()
    new_run[:, 1:] |= pos[:, 1:] != pos[:, :-1] + 1
    return new_run.sum().item() / new_document.sum().item()


# --- the three measured things ----------------------------------------------------------


def brute_force_counts(batch: dict[str, torch.Tensor], max_distance: int) -> torch.Tensor:
    """f(d) for d < max_distance plus one overflow bin, from the explicit [T, T] pair matrix per row."""
    counts = torch.zeros(max_distance + 1, dtype=torch.long)
    seq_len = batch["position_ids"].shape[1]
    causal = torch.ones(seq_len, seq_len, dtype=torch.bool).tril()
    for pos, doc, labels in zip(batch["position_ids"], batch["document_ids"], batch["labels"], strict=True):
        attended = causal & (doc[:, None] == doc[None, :]) & (labels != IGNORE_INDEX)[:, None]
        distance = (pos[:, None] - pos[None, :])[attended]
        counts += torch.bincount(distance.clamp(max=max_distance), minlength=max_distance + 1)
    return counts


def counted(batch: dict[str, torch.Tensor], max_distance: int) -> PositionFrequency:
    probe = PositionFrequency(max_distance, max_position=max_distance)
    probe.update(batch)
    return probe


def training_step(model: Llama, batch: dict[str, torch.Tensor]) -> None:
    model.zero_grad(set_to_none=True)
    logits = model(batch["input_ids"], position_ids=batch["position_ids"], document_ids=batch["document_ids"])
    loss = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=IGNORE_INDEX)
    loss.backward()


def median_ms(op: Callable[[], object], repeats: int) -> float:
    op()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        op()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


# --- table ------------------------------------------------------------------------------

COLUMNS = (
    "rows",
    "ids",
    "docs/row",
    "key runs/doc",
    "counter ms",
    "1 thread ms",
    "brute ms",
    "brute/counter",
    "step ms",
    "counter/step",
    "1 thread/step",
)


def measure(rows: int, document_lengths: list[int], model: Llama, args: argparse.Namespace) -> list[list[str]]:
    rng = random.Random(SEED + rows)
    packed = pack_documents(document_lengths, args.seq_len, rows, rng)
    batches = {kind: make_batch(packed, kind, rng) for kind in KINDS}
    step_ms = median_ms(lambda: training_step(model, batches["contiguous"]), args.repeats)
    table = []
    for kind, batch in batches.items():
        max_distance = args.seq_len if kind == "contiguous" else ID_STRETCH * args.seq_len
        probe = counted(batch, max_distance)
        start = time.perf_counter()
        expected = brute_force_counts(batch, max_distance)
        brute_ms = (time.perf_counter() - start) * 1e3
        if not (torch.equal(probe.relative, expected[:-1]) and int(probe.overflow) == int(expected[-1])):
            raise SystemExit(f"{kind}, {rows} rows: counter differs from the brute-force pair count; not timing it")
        count = functools.partial(counted, batch, max_distance)
        counter_ms = median_ms(count, args.counter_repeats)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        one_thread_ms = median_ms(count, args.counter_repeats)
        torch.set_num_threads(threads)
        table.append(
            [
                str(rows),
                kind,
                f"{sum(map(len, packed)) / rows:.1f}",
                f"{key_runs_per_document(batch):.1f}",
                f"{counter_ms:.2f}",
                f"{one_thread_ms:.2f}",
                f"{brute_ms:.0f}",
                f"{brute_ms / counter_ms:.0f}x",
                f"{step_ms:.0f}",
                f"{100 * counter_ms / step_ms:.3f}%",
                f"{100 * one_thread_ms / step_ms:.3f}%",
            ]
        )
        print(" | ".join(table[-1]), flush=True)
    return table


def markdown_table(rows: list[list[str]]) -> str:
    lines = [COLUMNS, ("---:",) * len(COLUMNS), *rows]
    return "\n".join("| " + " | ".join(cells) + " |" for cells in lines)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-len", type=int, default=4096, help="tokens per row T")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 3, 4], help="micro-batch sizes")
    parser.add_argument("--repeats", type=int, default=3, help="timed training steps (median reported)")
    parser.add_argument("--counter-repeats", type=int, default=20, help="timed counter calls (median reported)")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    torch.manual_seed(SEED)
    document_lengths = stdlib_document_lengths()
    model = Llama(ModelConfig.from_preset("tiny", attention_backend="varlen"))
    print(
        f"{len(document_lengths)} stdlib documents; T={args.seq_len}; tiny preset "
        f"({model.config.num_parameters() / 1e6:.1f}M parameters), varlen, float32, "
        f"{torch.get_num_threads()} threads",
        flush=True,
    )
    table = [line for rows in args.rows for line in measure(rows, document_lengths, model, args)]
    print()
    print(markdown_table(table))


if __name__ == "__main__":
    main()
