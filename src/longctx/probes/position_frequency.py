"""Position frequency f(i): how often training exercised each relative position (STRING §2.2-§3, docs/design.md §7.1).

A batch in the batch contract (docs/design.md §3) trains, for every query token q and every key k
of the same document with k not after q, the relative position

    d = position_ids[q] - position_ids[k]
    f(d) = #{(q, k): same document, k <= q, labels[q] != -100, d = position_ids[q] - position_ids[k]}

(with `labels=None` every query counts). For one document of n consecutive ids this is the
Toeplitz matrix of STRING Eq. 1, f(d) = n - d; over documents s it is Eq. 2,
f(d) = sum_s max(|s| - d, 0). STRING Figure 2(b) plots f at the model's effective
length; Figure 3 is f itself. Documents are the maximal runs of equal adjacent
`document_ids` in a row (what the varlen kernels attend within); a row boundary always
ends a document. Position ids must increase strictly within a document (checked), so
"k not after q" is the same as d >= 0.

This module owns the counters and a running accumulator:

- `relative_position_counts` -> f(d) for d in [0, max_distance), exact int64.
- `absolute_position_counts` -> tokens per position id in [0, max_position).
- `PositionFrequency` sums both over batches, checkpoints, all-reduces across ranks and
  reports the `fi/...` scalars.

Both counters return a `Histogram(counts, overflow)`: what falls beyond the last bin is
counted in `overflow`, never dropped silently and never clipped into the last bin (which
would fake a spike at d = max_distance - 1). counts.sum() + overflow is the exact total.

Two exact algorithms, picked per document (vectorised torch, no Python loop over tokens
or runs; details in `relative_position_counts`):

- runs: second-order difference arrays over pairs of runs of consecutive ids, integer
  arithmetic, O(R_q * R_k + T) per document (R_k runs of consecutive ids, R_q runs of
  labelled tokens with consecutive ids: about R_k plus the masked spans). O(T) per row
  for contiguous ids; a handful of runs for SkipAlign, PoSE and LongRecipe.
- fft: cross-correlation of the document's query and key id indicators, O(S log S) for
  an id span S, rounded to integers (float64 error ~1e-9). For RandPos-like ids, whose
  runs are ~1 token long, the runs method degrades to O(n^2) and the FFT wins.

Derivations: docs/fi_counting.md; timings: docs/benchmarks.md (`benchmarks/position_frequency.py`).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.distributed as dist

from longctx.batch import IGNORE_INDEX, document_start_mask
from longctx.probes.sliding_frequency import windowed_position_counts

"""Label of a token without loss (batch contract): such a token is not a counted query."""

METHODS = ("auto", "runs", "fft")
"""Algorithms of relative_position_counts (chosen per document; see its docstring)."""

FFT_COST_RATIO = 0.1
"""`auto` sends a document to the FFT when its run pairs exceed this times N log2 N. One CPU
thread spends 150-400 ns per run pair and 15-30 ns per N log2 N of FFT."""

_COUNTERS = ("relative", "overflow", "absolute", "absolute_overflow", "tokens_seen")
"""The accumulator's int64 tensors, in state_dict order."""


class Histogram(NamedTuple):
    counts: torch.Tensor
    """int64 [bins]: events in each bin."""
    overflow: torch.Tensor
    """int64 scalar: events at or beyond `bins` (nothing is clipped into the last bin)."""


# --- input checks ---------------------------------------------------------------------


def _check_tensors(reference_name: str, reference: torch.Tensor, **others: torch.Tensor | None) -> None:
    """All tensors integer [batch, seq] of the reference's shape."""
    if reference.dim() != 2:
        raise ValueError(f"{reference_name} must be [batch, seq], got shape {tuple(reference.shape)}")
    for name, tensor in ((reference_name, reference), *others.items()):
        if tensor is None:
            continue
        if tensor.dtype.is_floating_point or tensor.dtype.is_complex or tensor.dtype == torch.bool:
            raise TypeError(f"{name} must be an integer tensor, got {tensor.dtype}")
        if tensor.shape != reference.shape:
            raise ValueError(
                f"{name} has shape {tuple(tensor.shape)} but {reference_name} has {tuple(reference.shape)}"
            )


def _check_bins(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


def _to_cpu(*tensors: torch.Tensor | None) -> tuple[Any, ...]:
    """Counting runs on the CPU: its sizes depend on the data, so on a GPU every step of it
    would wait for the device; one copy of the [B, T] ids waits once."""
    return tuple(None if tensor is None else tensor.detach().to("cpu") for tensor in tensors)


def _queries(labels: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """Flat bool mask of counted query tokens."""
    if labels is None:
        return torch.ones(like.numel(), dtype=torch.bool)
    return labels.reshape(-1) != IGNORE_INDEX


# --- relative positions ---------------------------------------------------------------


def relative_position_counts(
    position_ids: torch.Tensor,
    document_ids: torch.Tensor,
    max_distance: int,
    labels: torch.Tensor | None = None,
    *,
    method: str = "auto",
) -> Histogram:
    """f(d) for d in [0, max_distance) over a [B, T] batch, exact; pairs at d >= max_distance -> overflow.

    Queries are the tokens with labels != -100 (all tokens when labels is None); keys are
    all tokens. Raises ValueError naming the row, token and document where position_ids do
    not increase strictly inside a document. `method` picks the algorithm per document:
    `runs` (integer, O(R_q * R_k) run pairs), `fft` (O(S log S) in the document's id span
    S) or `auto`: runs unless its run pairs exceed FFT_COST_RATIO * N log2 N (N = FFT
    length), i.e. only for RandPos-like ids whose runs are a few tokens long.

    Both are exact; the derivation of the runs method (second differences of trapezoids)
    and the FFT error bound are in docs/fi_counting.md.

    The exact total number of pairs is sum over counted queries of (1 + tokens before it
    in its document), so overflow = total - sum(f) for either method.
    """
    _check_tensors("position_ids", position_ids, document_ids=document_ids, labels=labels)
    _check_bins("max_distance", max_distance)
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    position_ids, document_ids, labels = _to_cpu(position_ids, document_ids, labels)
    positions, document_start, step = _flat_documents(position_ids.long(), document_ids)
    query = _queries(labels, position_ids)
    token = torch.arange(positions.numel())
    document = document_start.cumsum(0) - 1
    first_token = torch.where(document_start, token, 0).cummax(0).values
    # Exact total: a query pairs with every token from its document's start through itself.
    total = ((token - first_token + 1) * query).sum()

    runs = _Runs.of(positions, document_start, step, query, first_token)
    span = _document_spans(positions, document_start)
    fft_length = 2 ** torch.ceil(torch.log2(2 * span.double())).long()
    query_run_document = _take(document, runs.query_token)
    if method == "auto":
        pairs = torch.zeros_like(span).index_add_(0, query_run_document, runs.pairs)
        use_fft = pairs > FFT_COST_RATIO * fft_length * torch.log2(fft_length.double())
    else:
        use_fft = torch.full_like(span, method == "fft", dtype=torch.bool)

    counts = _runs_counts(runs, ~_take(use_fft, query_run_document), max_distance)
    if use_fft.any():
        counts += _fft_counts(positions, document, query, use_fft, fft_length, max_distance)
    return Histogram(counts, total - counts.sum())


class _Runs(NamedTuple):
    """Query runs of a flat batch and, for each, the key runs it pairs with (b <= a)."""

    query_token: torch.Tensor
    """[R_q] flat index of each query run's first token."""
    query_first: torch.Tensor
    """[R_q] a: first id of the query run."""
    query_length: torch.Tensor
    """[R_q] la."""
    earliest_run: torch.Tensor
    """[R_q] j0: first key run of the query run's document."""
    pairs: torch.Tensor
    """[R_q] j - j0 + 1: key runs j0..j (j contains the query run) pair with it."""
    key_first: torch.Tensor
    """[R_k] b: first id of each key run."""
    key_last: torch.Tensor
    """[R_k] b + lb - 1."""

    @classmethod
    def of(cls, positions, document_start, step, query, first_token) -> _Runs:
        key_start = document_start | (step != 1)
        previous_is_query = torch.zeros_like(query)
        previous_is_query[1:] = query[:-1]
        query_start = query & (key_start | ~previous_is_query)
        key_run = key_start.cumsum(0) - 1  # per token
        key_first = _take(positions, _indices(key_start))
        key_last = key_first + torch.bincount(key_run, minlength=key_first.numel()) - 1
        query_token = _indices(query_start)
        query_run = query_start.cumsum(0) - 1
        earliest_run = _take(key_run, _take(first_token, query_token))
        return cls(
            query_token=query_token,
            query_first=_take(positions, query_token),
            query_length=torch.bincount(_take(query_run, _indices(query)), minlength=query_token.numel()),
            earliest_run=earliest_run,
            pairs=_take(key_run, query_token) - earliest_run + 1,
            key_first=key_first,
            key_last=key_last,
        )


def _runs_counts(runs: _Runs, selected: torch.Tensor, max_distance: int) -> torch.Tensor:
    """f(d), d < max_distance, from the run pairs of the selected query runs (derivation above)."""
    pairs = torch.where(selected, runs.pairs, 0)
    ends = pairs.cumsum(0)
    pair = torch.arange(int(ends[-1]) if ends.numel() else 0)
    # repeat_interleave would do, but its CPU kernel starts threads for every call
    pair_query = torch.searchsorted(ends, pair, right=True)
    pair_key = _take(runs.earliest_run - ends + pairs, pair_query) + pair

    a, la = _take(runs.query_first, pair_query), _take(runs.query_length, pair_query)
    b, b_last = _take(runs.key_first, pair_key), _take(runs.key_last, pair_key)
    rising = torch.cat([a - b_last, a + la - b + 1])  # s0, s0 + la + lb
    falling = torch.cat([a + la - b_last, a - b + 1])  # s0 + la, s0 + lb

    bins = max_distance + 1
    second_difference = torch.bincount(rising.clamp(0, max_distance), minlength=bins) - torch.bincount(
        falling.clamp(0, max_distance), minlength=bins
    )
    negative_moment = rising.clamp(max=0).sum() - falling.clamp(max=0).sum()  # sum of w * s over s < 0
    second_difference[0] -= negative_moment
    second_difference[1] += negative_moment
    return second_difference.cumsum(0).cumsum(0)[:max_distance]


def _fft_counts(
    positions: torch.Tensor,
    document: torch.Tensor,
    query: torch.Tensor,
    use_fft: torch.Tensor,
    fft_length: torch.Tensor,
    max_distance: int,
) -> torch.Tensor:
    """f(d), d < max_distance, of the documents in use_fft by cross-correlation, one batched
    FFT per distinct FFT length."""
    counts = torch.zeros(max_distance, dtype=torch.long)
    first_id = torch.full_like(fft_length, torch.iinfo(torch.long).max).scatter_reduce_(0, document, positions, "amin")
    for length in _take(fft_length, _indices(use_fft)).unique().tolist():
        group = use_fft & (fft_length == length)
        row_of_document = torch.where(group, group.cumsum(0) - 1, -1)
        tokens = _indices(_take(row_of_document, document) >= 0)
        token_document = _take(document, tokens)
        rows = _take(row_of_document, token_document).numpy()
        columns = (_take(positions, tokens) - _take(first_id, token_document)).numpy()
        keys = np.zeros((int(group.sum()), length))
        queries = np.zeros_like(keys)
        keys[rows, columns] = 1.0
        queries[rows, columns] = _take(query, tokens).numpy()
        # numpy's FFT is single-threaded: torch's starts a thread pool per call, slow on a busy CPU
        lags = np.fft.irfft(np.fft.rfft(queries) * np.fft.rfft(keys).conj(), n=length)
        width = min(max_distance, length // 2)  # lags >= length / 2 hold the wrapped-around d < 0
        counts[:width] += torch.from_numpy(np.rint(lags[:, :width].sum(0)).astype(np.int64))
    return counts


def _document_spans(positions: torch.Tensor, document_start: torch.Tensor) -> torch.Tensor:
    """[documents] last id - first id + 1."""
    document_end = torch.ones_like(document_start)
    document_end[:-1] = document_start[1:]
    return _take(positions, _indices(document_end)) - _take(positions, _indices(document_start)) + 1


def _indices(mask: torch.Tensor) -> torch.Tensor:
    """Indices where a 1-D mask is true."""
    return mask.nonzero().squeeze(1)


def _take(values: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """values[index] for 1-D tensors. index_select rather than advanced indexing, whose CPU
    kernel goes parallel even for a few thousand elements and then stalls whenever another
    process holds the cores."""
    return values.index_select(0, index)


def _flat_documents(
    position_ids: torch.Tensor, document_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Row-major flat positions, document-start mask (row starts included) and the id step
    from the previous token; raises if ids do not increase strictly within a document."""
    document_start = document_start_mask(document_ids)
    step = torch.zeros_like(position_ids)
    step[:, 1:] = position_ids[:, 1:] - position_ids[:, :-1]
    not_increasing = ~document_start & (step <= 0)
    if not_increasing.any():
        row, column = (int(i) for i in not_increasing.nonzero()[0])
        raise ValueError(
            "position_ids must increase strictly within a document: row "
            f"{row}, token {column} (document id {int(document_ids[row, column])}) has position "
            f"{int(position_ids[row, column])} after {int(position_ids[row, column - 1])}"
        )
    return position_ids.reshape(-1), document_start.reshape(-1), step.reshape(-1)


# --- absolute positions ---------------------------------------------------------------


def absolute_position_counts(
    position_ids: torch.Tensor, max_position: int, labels: torch.Tensor | None = None
) -> Histogram:
    """Tokens at each position id in [0, max_position) (only labelled tokens when labels is
    given); ids >= max_position -> overflow. Raises ValueError on a negative id."""
    _check_tensors("position_ids", position_ids, labels=labels)
    _check_bins("max_position", max_position)
    position_ids, labels = _to_cpu(position_ids, labels)
    if position_ids.numel() and position_ids.min() < 0:
        row, column = (int(i) for i in (position_ids < 0).nonzero()[0])
        raise ValueError(f"position_ids must be >= 0: row {row}, token {column} is {int(position_ids[row, column])}")
    counted = _take(position_ids.reshape(-1).long(), _indices(_queries(labels, position_ids)))
    counts = torch.bincount(counted.clamp(max=max_position), minlength=max_position + 1)
    return Histogram(counts[:max_position], counts[max_position])


# --- accumulator ----------------------------------------------------------------------


class PositionFrequency:
    """f(d) and the absolute-position histogram summed over the batches one rank trained on.

    State (all int64, on CPU): `relative` [max_distance], `overflow` (pairs at d >=
    max_distance), `absolute` [max_position], `absolute_overflow` (tokens at ids >=
    max_position), `tokens_seen` (every token of every batch, labelled or not: the
    "consumed tokens" of STRING Figure 2a). With count_only_labeled (the default: SFT masks
    prompts) both histograms count labelled query tokens only; otherwise every token.

    Counting runs on the CPU (see `_to_cpu`): a GPU batch costs one copy of its three
    [B, T] id tensors. Count before the batch moves to the GPU where possible.

    Each rank counts its own batches. `all_reduce` returns the global sums and leaves the
    local counters alone, so logging twice never double counts; checkpoint either every
    rank's local state or the reduced state on one rank only.
    """

    def __init__(
        self,
        max_distance: int,
        max_position: int | None = None,
        count_only_labeled: bool = True,
        sliding_window: int = 0,
    ):
        _check_bins("max_distance", max_distance)
        max_position = max_distance if max_position is None else max_position
        _check_bins("max_position", max_position)
        self.max_distance = max_distance
        self.max_position = max_position
        self.count_only_labeled = count_only_labeled
        self.relative = torch.zeros(max_distance, dtype=torch.long)
        self.overflow = torch.zeros((), dtype=torch.long)
        self.absolute = torch.zeros(max_position, dtype=torch.long)
        self.absolute_overflow = torch.zeros((), dtype=torch.long)
        self.tokens_seen = torch.zeros((), dtype=torch.long)
        self.sliding_window = sliding_window
        """W > 0: also count f_W, what the model's sliding layers train (`sliding`,
        `sliding_overflow`; probes/sliding_frequency.py)."""
        self.counters = _COUNTERS + (("sliding", "sliding_overflow") if sliding_window else ())
        if sliding_window:
            self.sliding = torch.zeros(max_distance, dtype=torch.long)
            self.sliding_overflow = torch.zeros((), dtype=torch.long)

    def empty_like(self) -> PositionFrequency:
        """An accumulator of the same bins, zeroed."""
        return PositionFrequency(self.max_distance, self.max_position, self.count_only_labeled, self.sliding_window)

    def update(self, batch: dict[str, torch.Tensor]) -> None:
        """Count one batch-contract dict (`input_ids`, `position_ids`, `document_ids`, and
        `labels` when count_only_labeled)."""
        required = ["input_ids", "position_ids", "document_ids"] + (["labels"] if self.count_only_labeled else [])
        missing = [key for key in required if key not in batch]
        if missing:
            raise KeyError(f"PositionFrequency.update: batch lacks {missing} (has {sorted(batch)})")
        position_ids, document_ids, labels = _to_cpu(batch["position_ids"], batch["document_ids"], batch.get("labels"))
        _check_tensors("position_ids", position_ids, input_ids=batch["input_ids"])
        labels = labels if self.count_only_labeled else None
        relative = relative_position_counts(position_ids, document_ids, self.max_distance, labels)
        absolute = absolute_position_counts(position_ids, self.max_position, labels)
        self.relative += relative.counts
        self.overflow += relative.overflow
        self.absolute += absolute.counts
        self.absolute_overflow += absolute.overflow
        self.tokens_seen += batch["input_ids"].numel()
        if self.sliding_window:
            window, full = self.sliding_window, relative.counts
            counts, overflow = windowed_position_counts(
                position_ids, document_ids, self.max_distance, window, labels, full
            )
            self.sliding += counts
            self.sliding_overflow += overflow

    # --- persistence and reduction ---

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Plain tensors only (loads with torch.load(weights_only=True))."""
        state = {key: getattr(self, key).clone() for key in self.counters}
        state["count_only_labeled"] = torch.tensor(self.count_only_labeled)
        return state

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Replace the counters; bin counts and count_only_labeled must match this accumulator."""
        expected = self.state_dict()
        if set(state) != set(expected):
            raise KeyError(f"position-frequency state has keys {sorted(state)}, expected {sorted(expected)}")
        for key, tensor in expected.items():
            if state[key].shape != tensor.shape:
                raise ValueError(
                    f"position-frequency state {key!r} has shape {tuple(state[key].shape)}, this accumulator "
                    f"{tuple(tensor.shape)} (max_distance={self.max_distance}, max_position={self.max_position})"
                )
        if bool(state["count_only_labeled"]) != self.count_only_labeled:
            raise ValueError(
                f"position-frequency state was counted with count_only_labeled={bool(state['count_only_labeled'])}, "
                f"this accumulator uses {self.count_only_labeled}"
            )
        for key in self.counters:
            setattr(self, key, state[key].detach().to("cpu", torch.long).clone())

    def merge(self, other: PositionFrequency) -> None:
        """Add another accumulator's counts into this one (same bins and count_only_labeled)."""
        mine = (self.max_distance, self.max_position, self.count_only_labeled, self.sliding_window)
        theirs = (other.max_distance, other.max_position, other.count_only_labeled, other.sliding_window)
        if mine != theirs:
            raise ValueError(
                "cannot merge position frequencies (max_distance, max_position, count_only_labeled, "
                f"sliding_window) {theirs} into {mine}"
            )
        for key in self.counters:
            setattr(self, key, getattr(self, key) + getattr(other, key))

    def all_reduce(self) -> PositionFrequency:
        """A new accumulator holding the sums over all ranks of torch.distributed (a copy when
        it is not initialised). Collective: every rank must call it."""
        reduced = self.empty_like()
        reduced.load_state_dict(self.state_dict())
        if not (dist.is_available() and dist.is_initialized()):
            return reduced
        device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
        parts = [getattr(reduced, key).reshape(-1) for key in self.counters]
        flat = torch.cat(parts).to(device)
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        for key, part in zip(self.counters, flat.cpu().split([p.numel() for p in parts]), strict=True):
            setattr(reduced, key, part.reshape(getattr(reduced, key).shape).clone())
        return reduced

    # --- reporting ---

    def summary(self, window: int) -> dict[str, float]:
        """Scalars to log for training window L: f at L/4, L/2, 3L/4 and L-1 (integer division),
        the share of all counted pairs at d >= L/2 (NaN before any pair) and tokens_seen."""
        if isinstance(window, bool) or not isinstance(window, int) or not 1 <= window <= self.max_distance:
            raise ValueError(f"window must be an int in [1, max_distance={self.max_distance}], got {window!r}")
        f = self.relative
        total = int(f.sum() + self.overflow)
        at_least_half = int(f[(window + 1) // 2 :].sum() + self.overflow)  # d >= L/2 for integer d
        metrics = {
            **{f"fi/f@{label}": int(f[distance(window)]) for label, distance in SUMMARY_POSITIONS.items()},
            "fi/share_ge_half": at_least_half / total if total else math.nan,
            "fi/tokens_seen": int(self.tokens_seen),
        }
        if self.sliding_window:  # the sliding layers' f_W at W/2 and W-1 (within max_distance)
            last = min(self.sliding_window, self.max_distance) - 1
            metrics["fi/sliding_f@W/2"] = int(self.sliding[min(self.sliding_window // 2, last)])
            metrics["fi/sliding_f@W-1"] = int(self.sliding[last])
        return metrics

    def downsample(self, max_rows: int = 10_000) -> tuple[np.ndarray, np.ndarray]:
        """(d, f(d)) of the relative counts at <= max_rows points, for a line plot."""
        return downsample(self.relative, max_rows)


SUMMARY_POSITIONS = {
    "L/4": lambda window: window // 4,
    "L/2": lambda window: window // 2,
    "3L/4": lambda window: 3 * window // 4,
    "L-1": lambda window: window - 1,
}
"""The distances d whose f(d) `PositionFrequency.summary` logs as `fi/f@<label>`, for window L."""


def downsample(counts: torch.Tensor, max_rows: int = 10_000) -> tuple[np.ndarray, np.ndarray]:
    """(index, counts[index]) at min(len, max_rows) evenly spaced indices including the first
    and the last: exact values at the sampled indices, not bin averages (f is smooth, and a
    sampled f(d) stays a true count). W&B line plots cap out around 10,000 points."""
    if counts.dim() != 1 or counts.numel() == 0:
        raise ValueError(f"counts must be a non-empty 1-D tensor, got shape {tuple(counts.shape)}")
    if isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows < 2:
        raise ValueError(f"max_rows must be an int >= 2, got {max_rows!r}")
    size = counts.numel()
    # Spacing (size - 1) / (rows - 1) >= 1, so the rounded indices are distinct.
    index = torch.linspace(0, size - 1, min(size, max_rows), dtype=torch.float64).round().long()
    return index.numpy(), counts[index].cpu().numpy()
