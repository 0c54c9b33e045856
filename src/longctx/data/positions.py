"""Position-id transforms for training: SkipAlign, PoSE, RandPos and LongRecipe PIT (docs/design.md §9).

This module owns the position ids a sample is trained with when they are not 0..n-1.
Every transform is a pure function of the sample's structure, a target length and a
`numpy.random.Generator` (seed it per sample, e.g. `np.random.default_rng([seed, index])`,
so a sample's ids never depend on which other samples were drawn). The ids it returns are
int64, start at 0 (RandPos: anywhere in [0, Lt)), increase strictly and stay below the
target length, so the f(i) counter (`probes/position_frequency.py`) and every attention
backend accept them.

SkipAlign (Wu et al. 2024, §3.2, Eq. 2-4). A chat sample m of |m| tokens is a sequence of
blocks B_0..B_{K-1} whose roles alternate between `instruction` (system and user turns and
the assistant header: every token without a loss label) and `response`. Block j keeps its
tokens' consecutive ids and is shifted right by u_j = s_1 + ... + s_j (Eq. 2), where s_j
is the skip at the boundary between B_{j-1} and B_j. A boundary may skip when the strategy
allows it:

    all    every boundary (Skip-All)
    inner  instruction -> its response (Skip-Inner: "adds s_i when c_i is from a response")
    outer  response -> next instruction (Skip-Outer, the paper's default)

At an allowed boundary, with probability p (Eq. 4: a fresh coin per boundary,
`p_scope="boundary"`) the skip is drawn as

    s_j ~ U{1, L - |m| - u_{j-1}}                                    (Eq. 3)

and otherwise s_j = 0; once the budget L - |m| is spent no boundary skips again. So the
last id is at most |m| - 1 + (L - |m|) = L - 1. The budget halves in expectation with each
skip: the first skip averages (L - |m|) / 2, the second a quarter, and so on. The paper's
Figure 2 text ("SkipAlign extends the positional indices of a p% of the dataset") reads as
if p picked whole samples; `p_scope="sample"` does that: one coin per sample, and a sample
that wins it skips at every allowed boundary. The coin is `rng.random() < p` (Eq. 4 writes
eps <= p; the two differ on a set of measure zero), so p = 0 never skips and p = 1 always
does. On a single-turn sample (instruction, response) `inner` and `all` draw the same ids
and `outer` leaves them contiguous, i.e. Normal-SFT.

PoSE (Zhu et al. 2023, §3.2). n tokens are trained as if they sat in a target
window Lt: they are cut into N chunks c_0..c_{N-1} of lengths l_0..l_{N-1} (sum n); chunk i
keeps consecutive ids starting at st_i + u_i, with st_i = l_0 + ... + l_{i-1} and
the skipping bias drawn as u_i ~ U{u_{i-1}, ..., Lt - n}, u_0 = 0 (u_i >= u_{i-1}
keeps chunks from overlapping; the last id is n - 1 + u_{N-1} <= Lt - 1). Chunk lengths,
two readings:

    compat="paper"  the paper re-samples the chunk lengths per example without a rule:
                    here the N - 1 cut points are N - 1 distinct points of {1, ..., n-1}
                    drawn uniformly, i.e. a uniformly random composition of n into N parts.
    compat="repo"   the authors' code (two chunks): l_0 ~ U{1, ceil(n/2)}, the rest to
                    chunk 1. For N > 2 each chunk but the last draws at most its fair share
                    of what is left, l_i ~ U{1, ceil(r_i / (N - i))}, r_i the tokens left,
                    which is the code's rule at N = 2.

PoSE also skips content (chunk 1's tokens come from later in a document longer than the
window). Rows of the packed stream hold every stream token exactly once, so the
training pipeline applies the position part only (docs/context_extension.md). Biases of
neighbouring chunks can coincide (no skip), with probability about 1 / (Lt - n) per boundary.

RandPos (Ruoss et al. 2023): n distinct ids drawn uniformly without replacement from
[0, Lt) and sorted. Its runs of consecutive ids are ~1 token long when Lt >> n, so f(i) of
RandPos data takes the counter's FFT path.

LongRecipe PIT (Hu et al. 2024, §4.2 and Appendix C, Algorithm 1). A sample of n tokens is
split into sentences s_1..s_N (on `. ! ? \\n`, data/sentences.py); each sentence keeps
consecutive ids, s_1 starts at 0 and the later sentences land on N - 1 distinct random slots
of a target-length canvas (Eq. 6: pos(s_i) = pos(s_{i-1}) + |s_{i-1}| + g(s_i), a random
gap g >= 0; the printed Eq. 6 adds a further + 1, which contradicts its own "when M = 0
the position indices of the two segments will be continuous", so g = 0 is contiguous here). To keep every id below Lt, each sentence is one slot of a canvas of
C = Lt - n + N slots: sentence k > 1 sits on slot p_k, the N - 1 slots a uniform draw
without replacement from {1, ..., C - 1}, sorted, so

    pos(s_k) = p_k + sum_{j<k} (|s_j| - 1),  max id = p_N + n - N <= Lt - 1,

and the gaps are a uniformly random composition of at most Lt - n free ids. The ids are
those of the tokens the model trains on (`compat="paper"`). `compat="repo"` follows the
authors' preprocessing: the slots are drawn from the sentences of the unfiltered text
(`sentence_lengths` may then cover more tokens than the `context_length` trained), the
canvas keeps s_1 at slot 0 and puts the other sentences on the last N - 1 of N sorted
distinct slots of {0, ..., C - 1}, and a head of h ~ U{1, floor((n + 1) / 2)} tokens is
overwritten with the contiguous ids 0..h-1 (the rest keep their canvas ids, which are >= h,
so the ids still increase strictly; a sentence cut by the head is no longer contiguous).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

INSTRUCTION = "instruction"
RESPONSE = "response"
ROLES = (INSTRUCTION, RESPONSE)
"""Block roles of a chat sample: instruction = no loss label, response = loss label."""

STRATEGIES = ("all", "inner", "outer")
"""SkipAlign skipping strategies (§3.2): Skip-All, Skip-Inner, Skip-Outer."""

P_SCOPES = ("boundary", "sample")
"""What one SkipAlign coin decides: one allowed boundary (Eq. 4) or a whole sample."""


def skipalign_position_ids(
    block_lengths: Sequence[int],
    roles: Sequence[str],
    max_length: int,
    strategy: str,
    p: float,
    rng: np.random.Generator,
    p_scope: str = "boundary",
) -> np.ndarray:
    """SkipAlign ids (Eq. 2-4) of a sample whose blocks have these lengths and roles.

    `max_length` is L, the extended length (100K in the paper); the sample must fit in it.
    Returns int64 [sum(block_lengths)], strictly increasing from 0, max < L.
    """
    lengths = _block_lengths(block_lengths)
    _check_roles(roles, len(lengths))
    check_choice("strategy", strategy, STRATEGIES)
    check_choice("p_scope", p_scope, P_SCOPES)
    check_probability(p)
    _check_rng(rng)
    total = int(lengths.sum())
    _check_target_length("max_length", max_length, total)

    budget = max_length - total
    skips = np.zeros(len(lengths), dtype=np.int64)  # s_j before block j
    spent = 0  # u_{j-1}
    sample_coin = p_scope == "sample" and rng.random() < p
    for block in range(1, len(lengths)):
        if spent == budget:
            break
        if not _may_skip(roles[block - 1], roles[block], strategy):
            continue
        if sample_coin if p_scope == "sample" else rng.random() < p:
            skips[block] = rng.integers(1, budget - spent, endpoint=True)
            spent += int(skips[block])
    return np.arange(total, dtype=np.int64) + np.repeat(np.cumsum(skips), lengths)


POSE_COMPAT = ("paper", "repo")
"""PoSE chunk-length rules: a uniform composition (paper) or the authors' code (repo)."""

LONGRECIPE_COMPAT = ("paper", "repo")
"""LongRecipe PIT: Algorithm 1 on the trained tokens (paper) or the authors' preprocessing (repo)."""


def pose_position_ids(
    n: int, target_length: int, rng: np.random.Generator, chunks: int = 2, compat: str = "paper"
) -> np.ndarray:
    """PoSE ids of n tokens in a target window `target_length` (Lt), cut into `chunks` chunks.

    Returns int64 [n], strictly increasing from 0, max < Lt (see the module docstring).
    """
    _check_positive_int("n", n)
    _check_positive_int("chunks", chunks)
    check_choice("compat", compat, POSE_COMPAT)
    if chunks > n:
        raise ValueError(f"chunks={chunks} needs at least as many tokens, got n={n}")
    _check_target_length("target_length", target_length, n)
    _check_rng(rng)

    if compat == "paper":
        cuts = np.sort(rng.choice(n - 1, size=chunks - 1, replace=False) + 1) if chunks > 1 else np.zeros(0, np.int64)
        lengths = np.diff(np.concatenate([[0], cuts, [n]])).tolist()
    else:
        lengths, left = [], n
        for chunk in range(chunks - 1):
            length = int(rng.integers(1, math.ceil(left / (chunks - chunk)), endpoint=True))
            lengths.append(length)
            left -= length
        lengths.append(left)
    biases = [0]
    for _ in range(chunks - 1):
        biases.append(int(rng.integers(biases[-1], target_length - n, endpoint=True)))
    return np.arange(n, dtype=np.int64) + np.repeat(np.asarray(biases, dtype=np.int64), lengths)


def longrecipe_position_ids(
    sentence_lengths: Sequence[int] | np.ndarray,
    target_length: int,
    rng: np.random.Generator,
    compat: str = "paper",
    context_length: int | None = None,
) -> np.ndarray:
    """LongRecipe PIT ids (§4.2, Algorithm 1) of a sample whose sentences have these lengths.

    `context_length` (L_c) is the number of tokens trained, by default sum(sentence_lengths);
    with compat="paper" it must be that sum, with compat="repo" the sentences may describe
    a longer (unfiltered) text and ids are returned for its first L_c tokens. Returns int64
    [L_c], strictly increasing from 0, max < target_length (L_t); with compat="paper" the ids
    are contiguous inside each sentence (see the module docstring for both variants).
    """
    lengths = _block_lengths(sentence_lengths, "sentence_lengths")
    check_choice("compat", compat, LONGRECIPE_COMPAT)
    _check_rng(rng)
    total = int(lengths.sum())
    if context_length is None:
        context_length = total
    _check_positive_int("context_length", context_length)
    if compat == "paper" and context_length != total:
        raise ValueError(
            f"context_length={context_length} but sentence_lengths sum to {total}: compat='paper' places exactly "
            "the trained tokens (only compat='repo' reads the gaps from a longer, unfiltered text)"
        )
    if context_length > total:
        raise ValueError(f"context_length={context_length} exceeds the {total} tokens sentence_lengths describe")
    too_long = np.flatnonzero(lengths > context_length)
    if len(too_long):
        sentence = int(too_long[0])
        raise ValueError(
            f"sentence_lengths[{sentence}]={int(lengths[sentence])} is longer than context_length={context_length}"
        )
    _check_target_length("target_length", target_length, context_length)
    if total > target_length:
        raise ValueError(f"target_length={target_length} is shorter than the {total} tokens of sentence_lengths")

    sentences = len(lengths)
    canvas = target_length - total + sentences
    if compat == "paper":
        slots = np.sort(rng.choice(canvas - 1, size=sentences - 1, replace=False) + 1)
    else:
        slots = np.sort(rng.choice(canvas, size=sentences, replace=False))[1:]
    slots = np.concatenate([[0], slots]).astype(np.int64)
    first_ids = slots + np.concatenate([[0], np.cumsum(lengths[:-1] - 1)])
    offsets = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    ids = (np.repeat(first_ids, lengths) + offsets)[:context_length]
    if compat == "repo":
        head = int(rng.integers(1, (context_length + 1) // 2, endpoint=True))
        ids[:head] = np.arange(head)
    return ids


def randpos_position_ids(n: int, target_length: int, rng: np.random.Generator) -> np.ndarray:
    """RandPos ids: n distinct ids uniform on [0, target_length), sorted. int64 [n]."""
    _check_positive_int("n", n)
    _check_target_length("target_length", target_length, n)
    _check_rng(rng)
    return np.sort(rng.choice(target_length, size=n, replace=False)).astype(np.int64)


def _may_skip(before: str, after: str, strategy: str) -> bool:
    """Whether the strategy allows a skip at a boundary between blocks of these roles."""
    if strategy == "all":
        return True
    if strategy == "inner":
        return before == INSTRUCTION and after == RESPONSE
    return before == RESPONSE and after == INSTRUCTION


# --- input checks ---------------------------------------------------------------------


def _block_lengths(block_lengths: Sequence[int] | np.ndarray, name: str = "block_lengths") -> np.ndarray:
    lengths = np.asarray(block_lengths)
    if lengths.ndim != 1 or len(lengths) == 0 or not np.issubdtype(lengths.dtype, np.integer):
        raise ValueError(f"{name} must be a non-empty sequence of ints, got {block_lengths!r}")
    if (lengths < 1).any():
        block = int(np.flatnonzero(lengths < 1)[0])
        raise ValueError(f"{name}[{block}] is {int(lengths[block])}; every entry needs >= 1 token")
    return lengths.astype(np.int64)


def _check_roles(roles: Sequence[str], blocks: int) -> None:
    if len(roles) != blocks:
        raise ValueError(f"roles has {len(roles)} entries but block_lengths has {blocks}")
    for block, role in enumerate(roles):
        if role not in ROLES:
            raise ValueError(f"roles[{block}] is {role!r}, expected one of {ROLES}")
        if block and role == roles[block - 1]:
            raise ValueError(
                f"roles[{block - 1}] and roles[{block}] are both {role!r}: blocks must alternate between "
                "instruction and response (merge consecutive blocks of one role)"
            )


def check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")


def check_probability(p: float) -> None:
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p <= 1.0:
        raise ValueError(f"p must be a probability in [0, 1], got {p!r}")


def _check_rng(rng: np.random.Generator) -> None:
    if not isinstance(rng, np.random.Generator):
        raise TypeError(
            "rng must be a numpy.random.Generator (e.g. np.random.default_rng([seed, index])), "
            f"got {type(rng).__name__}"
        )


def _check_positive_int(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


def _check_target_length(name: str, value: int, tokens: int) -> None:
    _check_positive_int(name, value)
    if value < tokens:
        raise ValueError(f"{name}={value} is shorter than the sample ({tokens} tokens); ids must stay below it")
