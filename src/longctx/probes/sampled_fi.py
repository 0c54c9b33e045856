"""f(i) of a corpus too large to tokenise for a look: STRING Figure 1(a) from a sample.

    longctx fi data/slimpajama/train --window 2048 --sample 0.001 --seed 0 --tokenizer llama3

Every record of the shards (data/shard_reader.py) is drawn independently with probability
p = FRACTION (a seeded generator, in the stable shard order), and only drawn records are
parsed and tokenised. For a document of n tokens (EOS included, as `longctx prepare`
writes it) cut into natural pieces of at most L tokens (q = n // L full pieces and a
remainder r = n mod L), its share of STRING Eq. 2 is

    g(i) = q (L - i) + max(r - i, 0),      0 <= i < L,

and f(i) = sum over documents of g(i). The estimate is the Horvitz-Thompson sum
f^(i) = (1/p) sum over sampled documents of g(i), unbiased whatever the length
distribution; the length histogram is scaled the same way.

Interval: a Poisson bootstrap. Each of B replicates weights every sampled document by an
independent Poisson(1) count (the resampling analogue of Bernoulli sampling, whose sample
size is itself random) and recomputes f^; the 2.5th and 97.5th percentiles of the
replicates bound the 95% interval at each i. It leaves out the finite-population factor
(1 - p), so it is slightly wide (by 1/sqrt(1 - p): 5% at p = 0.1). Each replicate costs one
weighted histogram of the remainders and two reverse cumulative sums: O(samples + L).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from longctx.data.shard_reader import EXAMPLES_KEPT, CorpusReport, MetadataFilter, find_shards, shard_texts
from longctx.probes.dataset_fi import save_figure

BOOTSTRAP_REPLICATES = 200
REPORT_POSITIONS = ("1", "L/4", "L/2", "L-1")


def report_positions(window: int) -> list[int]:
    """i = 1, L/4, L/2, L-1: where the estimate is printed (the tails matter most)."""
    return [1, window // 4, window // 2, window - 1]


def frequency_from_histogram(histogram: np.ndarray, window: int) -> np.ndarray:
    """Eq. 2 from a (possibly weighted) histogram h[n] of piece lengths n in 0..L:
    f(i) = sum_{n > i} (n - i) h[n], float64 [L]."""
    histogram = np.asarray(histogram, dtype=np.float64)
    weighted = np.cumsum((np.arange(window + 1) * histogram)[::-1])[::-1]
    counts = np.cumsum(histogram[::-1])[::-1]
    return weighted[1:] - np.arange(window) * counts[1:]


def _piece_histogram(lengths: np.ndarray, window: int, weights: np.ndarray | None = None) -> np.ndarray:
    full, rest = np.divmod(lengths, window)
    histogram = np.bincount(rest, weights=weights, minlength=window + 1)[: window + 1].astype(np.float64)
    histogram[0] = 0.0  # remainder 0: no piece
    histogram[window] += float(np.sum(full if weights is None else full * weights))
    return histogram


@dataclass
class SampledFrequency:
    """The estimate of f(i) and its bootstrap 95% interval, from a sample of documents."""

    window: int
    fraction: float
    seed: int
    lengths: np.ndarray
    """Token counts (EOS included) of the sampled documents, in reading order."""
    estimate: np.ndarray
    low: np.ndarray
    high: np.ndarray
    counts: CorpusReport
    """What the sampled records produced (documents, filtered, rejected with their place)."""

    def summary_lines(self) -> list[str]:
        L, p = self.window, self.fraction
        lines = [
            f"sample: {len(self.lengths):,} documents ({p:g} of the records; seed {self.seed}): "
            f"~{len(self.lengths) / p:,.0f} documents and ~{self.lengths.sum() / p:,.0f} tokens in the corpus"
        ]
        for label, i in zip(REPORT_POSITIONS, report_positions(L), strict=True):
            estimate = self.estimate[i]
            half = (self.high[i] - self.low[i]) / 2
            share = f" (half-width {100 * half / estimate:.1f}%)" if estimate else ""
            lines.append(
                f"f({label}={i}) ~ {estimate:.4g}, 95% interval [{self.low[i]:.4g}, {self.high[i]:.4g}]{share}"
            )
        return lines

    def length_histogram(self, bins: int = 40) -> tuple[np.ndarray, np.ndarray]:
        """(edges, estimated documents per bin): log-spaced token-length bins, counts x 1/p."""
        top = max(int(self.lengths.max()) if len(self.lengths) else 1, 2)
        edges = np.unique(np.geomspace(1, top + 1, bins + 1).astype(np.int64))
        counts, _ = np.histogram(self.lengths, bins=edges)
        return edges, counts / self.fraction

    def to_json(self) -> dict:
        edges, documents = self.length_histogram()
        return {
            "window": self.window,
            "fraction": self.fraction,
            "seed": self.seed,
            "documents_sampled": len(self.lengths),
            "documents_estimated": len(self.lengths) / self.fraction,
            "tokens_estimated": float(self.lengths.sum() / self.fraction),
            "f_estimate": self.estimate.tolist(),
            "f_low": self.low.tolist(),
            "f_high": self.high.tolist(),
            "length_bins": edges.tolist(),
            "length_documents_estimated": documents.tolist(),
            "filtered_sampled": self.counts.filtered,
            "skipped_sampled": self.counts.count_by_kind(),
            "summary": self.summary_lines(),
        }


def estimate_fi(
    lengths: np.ndarray, window: int, fraction: float, seed: int, replicates: int = BOOTSTRAP_REPLICATES
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(estimate, low, high) of f(i) from the lengths of a Bernoulli(fraction) sample."""
    lengths = np.asarray(lengths, dtype=np.int64)
    estimate = frequency_from_histogram(_piece_histogram(lengths, window), window) / fraction
    rng = np.random.default_rng([seed, 1])  # the replicates' own stream, apart from the draw
    draws = np.empty((replicates, window))
    for b in range(replicates):
        weights = rng.poisson(1.0, len(lengths)).astype(np.float64)
        draws[b] = frequency_from_histogram(_piece_histogram(lengths, window, weights), window) / fraction
    low, high = np.percentile(draws, [2.5, 97.5], axis=0)
    return estimate, low, high


def sampled_fi(
    sources: Sequence[str],
    tokenizer_spec: str,
    window: int,
    fraction: float,
    seed: int,
    *,
    text_key: str = "text",
    keep: MetadataFilter | None = None,
    on_bad_input: str = "error",
    replicates: int = BOOTSTRAP_REPLICATES,
) -> SampledFrequency:
    """Sample, tokenise and estimate (see the module docstring)."""
    from longctx.data.tokenizer import load_tokenizer
    from longctx.errors import DataError

    if not 0 < fraction <= 1:
        raise DataError(f"--sample {fraction}: a fraction in (0, 1]")
    if window < 2:
        raise DataError(f"--window {window}: at least 2")
    tokenizer = load_tokenizer(tokenizer_spec)
    rng = np.random.default_rng(seed)
    counts = CorpusReport(examples_kept=EXAMPLES_KEPT)
    lengths: list[int] = []
    batch: list[str] = []

    def flush() -> None:
        lengths.extend(len(ids) + 1 for ids in tokenizer.encode_batch(batch))
        batch.clear()

    for shard in find_shards(sources):
        for text in shard_texts(
            shard.path,
            text_key=text_key,
            keep=keep,
            on_bad_input=on_bad_input,
            counts=counts,
            select=lambda: rng.random() < fraction,
        ):
            batch.append(text)
            if len(batch) == 256:
                flush()
    flush()
    if not lengths:
        raise DataError(f"a {fraction:g} sample of {list(sources)} drew no usable document; sample more")
    sample = np.asarray(lengths, dtype=np.int64)
    estimate, low, high = estimate_fi(sample, window, fraction, seed, replicates)
    return SampledFrequency(window, fraction, seed, sample, estimate, low, high, counts)


def plot_sampled(result: SampledFrequency, path: str | Path) -> Path:
    """STRING Figure 1(a) from the sample: f(i) with its 95% band (blue), the estimated
    document-length histogram (orange, log-spaced bins)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    positions = np.arange(result.window)
    left.plot(positions, result.estimate, color="tab:blue", label="f(i) estimate")
    left.fill_between(positions, result.low, result.high, color="tab:blue", alpha=0.3, label="95% interval")
    left.set_xlabel("position index i")
    left.set_ylabel("frequency f(i)")
    left.set_title(f"f(i), L={result.window}, from a {result.fraction:g} sample")
    left.legend()
    edges, documents = result.length_histogram()
    right.stairs(documents, edges, fill=True, color="tab:orange", alpha=0.6)
    right.set_xscale("log")
    right.axvline(result.window, color="black", linestyle="--", linewidth=1)
    right.set_xlabel("document length (tokens)")
    right.set_ylabel("documents (estimated)")
    right.set_title("document lengths")
    return save_figure(figure, path)


def write_sampled(result: SampledFrequency, out_dir: str | Path) -> tuple[Path, Path]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"fi_sampled_L{result.window}_p{result.fraction:g}_s{result.seed}"
    numbers = out_dir / f"{stem}.json"
    numbers.write_text(json.dumps(result.to_json()) + "\n")
    return numbers, plot_sampled(result, out_dir / f"{stem}.png")
