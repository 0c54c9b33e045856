"""f(i) of a dataset without training (STRING §2.2, Eq. 2 and Figure 1).

    longctx fi data/embedded --window 2048            # prepared dataset (lengths.npy)
    longctx fi corpus.jsonl --window 2048 --tokenizer bpe-8192 --out runs/fi

For training window L and document lengths |s|, Eq. 2 gives

    f(i) = sum_s max(|s| - i, 0),   0 <= i < L

computed from the length histogram h[n] in O(L + N): f(i) = sum_{n > i} (n - i) h[n], i.e. two
reverse cumulative sums. Figure 1 compares three ways of cutting the same tokens:

(a) natural: every document longer than L is split into L-sized pieces (plus a remainder);
(b) uniform: the same number of tokens in documents of uniformly distributed length 1..L,
    so f declines quadratically: f(i) ~ (L - i)(L - i + 1) / 2 per length class;
(c) concatenated: all tokens packed into rows of exactly L, so f(i) = rows x (L - i).

`packed_rows_fi` counts what training with `data.doc_mask` would actually see, by running
the f(i) counter over one epoch of packed rows (documents cut at row boundaries).
`relative_distance_histogram` counts the response queries of SFT rows (SkipAlign
Figure 2: how far each SFT variant's skipped ids reach). `transformed_fi` gives the natural pieces PoSE or RandPos position ids spread over a target
length Lt > L (docs/design.md §9) and counts their pairs exactly: the relative positions such
training reaches beyond L.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from longctx.batch import BATCH_KEYS
from longctx.data.shard_reader import MetadataFilter
from longctx.probes.position_frequency import Histogram, relative_position_counts

DISTRIBUTIONS = ("natural", "uniform", "concatenated")


def frequency_from_lengths(lengths: np.ndarray, window: int) -> np.ndarray:
    """Eq. 2 for documents of the given lengths (each <= window), int64 [window]."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if len(lengths) and (lengths.min() < 0 or lengths.max() > window):
        raise ValueError(f"document lengths must lie in [0, window={window}]; split longer documents first")
    histogram = np.bincount(lengths, minlength=window + 1)[: window + 1]
    # f(i) = sum_{n > i} n h[n] - i sum_{n > i} h[n]
    weighted = np.cumsum((np.arange(window + 1) * histogram)[::-1])[::-1]
    counts = np.cumsum(histogram[::-1])[::-1]
    index = np.arange(window)
    return weighted[1 : window + 1] - index * counts[1 : window + 1]


def split_lengths(lengths: np.ndarray, window: int) -> np.ndarray:
    """Documents longer than `window` become full pieces plus their remainder."""
    lengths = np.asarray(lengths, dtype=np.int64)
    full, rest = np.divmod(lengths, window)
    return np.concatenate([np.repeat(window, int(full.sum())), rest[rest > 0]])


@dataclass
class DatasetFrequency:
    """f(i) under the three Figure 1 cuts, with the document lengths behind each."""

    window: int
    frequency: dict[str, np.ndarray]
    lengths: dict[str, np.ndarray]

    def share(self, name: str, low: int, high: int) -> float:
        f = self.frequency[name]
        return float(f[low:high].sum() / f.sum())

    def summary_lines(self) -> list[str]:
        L = self.window
        lines = []
        for name in self.frequency:
            small = self.share(name, 0, L // 2 + 1)
            large = self.share(name, (3 * L + 3) // 4, L)
            lines.append(
                f"{name:>12}: positions i <= L/2 account for {100 * small:.1f}% of all indices; "
                f"i >= 3L/4 for {100 * large:.1f}%"
            )
        return lines

    def to_json(self) -> dict:
        return {
            "window": self.window,
            "frequency": {k: v.tolist() for k, v in self.frequency.items()},
            "documents": {k: len(v) for k, v in self.lengths.items()},
            "summary": self.summary_lines(),
            "tokens": int(self.lengths["natural"].sum()),
        }


def figure1_frequencies(document_lengths: np.ndarray, window: int) -> DatasetFrequency:
    document_lengths = np.asarray(document_lengths, dtype=np.int64)
    total = int(document_lengths.sum())
    natural = split_lengths(document_lengths, window)
    # Uniform: equal counts per length 1..L carrying the same total tokens (rounded down).
    per_length = total // (window * (window + 1) // 2)
    uniform = np.repeat(np.arange(1, window + 1), max(per_length, 1))
    concatenated = np.repeat(window, total // window)
    lengths = {"natural": natural, "uniform": uniform, "concatenated": concatenated}
    return DatasetFrequency(window, {k: frequency_from_lengths(v, window) for k, v in lengths.items()}, lengths)


def packed_rows_fi(directory: str | Path, window: int, eos_id: int, doc_mask: bool, seed: int = 1234) -> np.ndarray:
    """f(i) of one epoch of packed training rows, counted from the batch contract."""
    from longctx.data.packing import PackedRows, PackedSource
    from longctx.probes.position_frequency import PositionFrequency

    source = PackedSource(directory, seed=seed)
    rows_per_epoch = source.epoch_tokens // (window + 1)
    rows = PackedRows([source], [1.0], window=window, eos_id=eos_id, doc_mask=doc_mask)
    counts = PositionFrequency(window, count_only_labeled=False)
    for batch in _batches(itertools.islice(rows, rows_per_epoch), 64, keys=BATCH_KEYS):
        counts.update(batch)
    return counts.relative.numpy()


TRANSFORMS = ("pose", "randpos")


def transformed_fi(
    document_lengths: np.ndarray, window: int, transform: str, target_length: int, seed: int = 0
) -> np.ndarray:
    """f(i) for i < target_length of the natural pieces under a position-id transform."""
    from longctx.data.positions import pose_position_ids, randpos_position_ids
    from longctx.probes.position_frequency import PositionFrequency

    if transform not in TRANSFORMS:
        raise ValueError(f"transform {transform!r} is not one of {TRANSFORMS}")
    if target_length < window:
        raise ValueError(f"target length {target_length} is below the window {window}")
    rng = np.random.default_rng(seed)
    counts = PositionFrequency(target_length, count_only_labeled=False)
    for n in split_lengths(document_lengths, window):
        n = int(n)
        if transform == "pose" and n >= 2:
            ids = pose_position_ids(n, target_length, rng)
        elif transform == "randpos":
            ids = randpos_position_ids(n, target_length, rng)
        else:
            ids = np.arange(n)
        row = torch.as_tensor(ids)[None]
        counts.update(
            {
                "position_ids": row,
                "document_ids": torch.zeros_like(row),
                "input_ids": row,
                "labels": torch.zeros_like(row),
            }
        )
    return counts.relative.numpy()


def save_figure(figure, path: str | Path) -> Path:
    """Lay out `figure`, write it to `path` (folders made) at 120 dpi and free it."""
    import matplotlib.pyplot as plt

    figure.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path


def plot_figure1(result: DatasetFrequency, path: str | Path) -> Path:
    """Three panels like STRING Figure 1: f(i) (blue) and document lengths (orange)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 3, figsize=(15, 4))
    bins = np.linspace(0, result.window, 33)
    for axis, name in zip(axes, DISTRIBUTIONS, strict=True):
        axis.bar(np.arange(result.window), result.frequency[name], width=1.0, color="tab:blue", label="f(i)")
        axis.set_xlabel("position index i / document length")
        axis.set_ylabel("frequency f(i)")
        axis.set_title(f"({'abc'[DISTRIBUTIONS.index(name)]}) {name}")
        lengths_axis = axis.twinx()
        lengths_axis.hist(result.lengths[name], bins=bins, color="tab:orange", alpha=0.5)
        lengths_axis.set_ylabel("documents")
    return save_figure(figure, path)


def document_lengths(
    source: str,
    tokenizer_spec: str,
    *,
    text_key: str = "text",
    keep: MetadataFilter | None = None,
    on_bad_input: str = "error",
) -> np.ndarray:
    """Token counts (with EOS) of a prepared directory's documents, or of any corpus source
    as `longctx prepare` reads it (corpus.source_texts: shards under `on_bad_input`, whose
    skipped items are printed with file and line)."""
    from longctx.data.packing import LENGTHS_FILE

    if Path(source, LENGTHS_FILE).exists():
        return np.load(Path(source, LENGTHS_FILE))
    from longctx.data.corpus import CorpusReport, source_texts
    from longctx.data.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(tokenizer_spec)
    report = CorpusReport()
    texts = source_texts(source, report, text_key=text_key, keep=keep, on_bad_input=on_bad_input)
    lengths = [len(tokenizer.encode(text)) + 1 for text in texts]
    if report.rejected:
        print(report.summary())
    return np.asarray(lengths, dtype=np.int64)


def write_outputs(result: DatasetFrequency, out_dir: str | Path) -> tuple[Path, Path]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    numbers = out_dir / f"fi_L{result.window}.json"
    numbers.write_text(json.dumps(result.to_json()) + "\n")
    return numbers, plot_figure1(result, out_dir / f"fi_L{result.window}.png")


def relative_distance_histogram(
    rows: Iterable[Mapping[str, torch.Tensor]], max_distance: int, rows_per_call: int = 256
) -> Histogram:
    """f(d) of response queries summed over contract rows ([T] or [B, T] dicts): SkipAlign Figure 2.

    Pairs at d >= max_distance are counted in `overflow`. An `SFTRows` can be passed as it
    is: its [T] rows are stacked `rows_per_call` at a time, since each counter call has a
    fixed cost that dominates for short rows.
    """
    counts, overflow = torch.zeros(max_distance, dtype=torch.long), torch.zeros((), dtype=torch.long)
    for batch in _batches(rows, rows_per_call):
        histogram = relative_position_counts(
            batch["position_ids"], batch["document_ids"], max_distance, batch["labels"]
        )
        counts += histogram.counts
        overflow += histogram.overflow
    return Histogram(counts, overflow)


def _batches(
    rows: Iterable[Mapping[str, torch.Tensor]],
    size: int,
    keys: tuple[str, ...] = ("position_ids", "document_ids", "labels"),
) -> Iterable[dict[str, torch.Tensor]]:
    """[B, T] dicts of `keys` (by default those f(d) reads): [B, T] rows as they are, [T] rows
    stacked `size` at a time."""
    pending: list[Mapping[str, torch.Tensor]] = []
    for row in rows:
        if row["position_ids"].dim() == 2:
            yield {key: row[key] for key in keys}
            continue
        if pending and pending[-1]["position_ids"].shape != row["position_ids"].shape:
            yield {key: torch.stack([r[key] for r in pending]) for key in keys}
            pending = []
        pending.append(row)
        if len(pending) == size:
            yield {key: torch.stack([r[key] for r in pending]) for key in keys}
            pending = []
    if pending:
        yield {key: torch.stack([r[key] for r in pending]) for key in keys}


# --- embedded dataset -----------------------------------------------------------------
