"""RULER's aggregation tasks: common words (`cwe`) and frequent words (`fwe`) extraction
(NVIDIA/RULER scripts/data/synthetic/common_words_extraction.py, freq_words_extraction.py).

cwe: n words drawn without replacement from wonderwords' nouns + adjectives + verbs (8,169
distinct); the first 10 are the common words, repeated 30 times, the rest 3 times (6 and
1 below length 4096), the list shuffled and numbered "1. w 2. w ..."; one example of the same
task with 40 words (10 x 10, 30 x 3; below 4096: 20 words, 10 x 3, 10 x 1) and its answer
comes first. Outputs: the 10 common words; 120 tokens to generate. Past 8,169 words RULER
switches to a larger English list that is not available offline: n stops there (as in the
STRING copy) and the prompt is shorter than the length allows.

fwe: a vocabulary of (length - 50) // 50 random 6-letter words (distinct, sorted, shuffled),
the first replaced by "..." (noise); word k appears int(N k^-alpha / zeta(alpha)) times
(alpha = 2), the words shuffled and joined by spaces. Outputs: vocabulary words 2-4 (the
three most frequent after "..."); 50 tokens to generate. N is the largest count that fits
(RULER steps N by length/32, so its prompts can be up to that much shorter). The vocabulary
is drawn from a pool of 65,536+ random words tokenised once per context (`_coded_pool`).
"""

from __future__ import annotations

import functools
import operator
import zlib

import numpy as np

from longctx.eval.prompt_pieces import Piece, Ragged, Segment
from longctx.eval.ruler.constants import FAMILIES, Task
from longctx.eval.ruler.context import RulerContext
from longctx.eval.ruler.tokens import Prompt, fit_prompt, frame_prompt

SHORT_LENGTH = 4096
"""Below this length cwe uses fewer repeats (RULER's max_seq_length < 4096 branch)."""


def _numbered_text(words: list[str]) -> str:
    return " ".join(map(operator.add, _number_prefixes(len(words)), words))


@functools.cache
def _prefixes(size: int) -> list[str]:
    return [f"{i}. " for i in range(1, size + 1)]


def _number_prefixes(count: int) -> list[str]:
    """ "1. ", "2. ", ... (cached in blocks of 2^k)."""
    return _prefixes(1 << max(count - 1, 1).bit_length())[:count]


def _repeat_list(ctx: RulerContext, count: int, common: int, repeats: tuple[int, int]) -> np.ndarray:
    """Positions into the drawn words: the common ones `repeats[0]` times, the rest `repeats[1]`
    times, in RULER's fixed shuffle."""
    order = np.concatenate([np.tile(np.arange(common), repeats[0]), np.tile(np.arange(common, count), repeats[1])])
    return order[ctx.fixed_permutation(len(order))]


def _interleave(numbers: Ragged, words: Ragged, word_indices: np.ndarray) -> np.ndarray:
    """Ids of " 1. w " ... entries: number i+1 then word_indices[i], the first number left out."""
    count = len(word_indices)
    number_lengths = numbers.lengths[:count].copy()
    number_lengths[0] = 0
    word_lengths = words.lengths[word_indices]
    entry_lengths = number_lengths + word_lengths
    entry_starts = np.cumsum(entry_lengths) - entry_lengths
    out = np.empty(int(entry_lengths.sum()), dtype=np.int64)
    number_ids = numbers.gather(np.arange(1, count))
    within = np.arange(len(number_ids)) - np.repeat(
        np.cumsum(number_lengths[1:]) - number_lengths[1:], number_lengths[1:]
    )
    out[np.repeat(entry_starts[1:], number_lengths[1:]) + within] = number_ids
    word_ids = words.gather(word_indices)
    within = np.arange(len(word_ids)) - np.repeat(np.cumsum(word_lengths) - word_lengths, word_lengths)
    out[np.repeat(entry_starts + number_lengths, word_lengths) + within] = word_ids
    return out


def cwe_sample(ctx: RulerContext, task: Task, length: int, index: int) -> tuple[Prompt, list[str], dict]:
    rng = ctx.rng(task.name, length, index)
    family = FAMILIES["common_words_extraction"]
    words = ctx.cwe_words
    common = task.args["num_cw"]
    short = length < SHORT_LENGTH
    example_size, example_repeats = (20, (3, 1)) if short else (40, (10, 3))
    repeats = (6, 1) if short else (task.args["freq_cw"], task.args["freq_ucw"])

    example_words = [words[i] for i in rng.choice(len(words), example_size, replace=False)]
    example_list = [example_words[i] for i in _repeat_list(ctx, example_size, common, example_repeats)]
    glue = "" if ctx.options.copy == "string" else " "
    example = (
        family.template.format(context=_numbered_text(example_list))
        + family.answer_prefix
        + glue
        + _numbered_text(example_words[:common])
    )
    head_text, question = family.template.split("{context}")
    head = ctx.encoder.piece(example + "\n" + head_text + "1.")  # tokenised once per sample
    order = rng.permutation(len(words))
    word_lengths = ctx.cwe_word_ids.lengths[order]
    word_cumulative = np.concatenate([[0], np.cumsum(word_lengths)])
    numbers = ctx.numbered(common * repeats[0] + len(words) * repeats[1])
    number_cumulative = np.concatenate([[0], np.cumsum(numbers.lengths)])

    def entries(size: int) -> int:
        return common * repeats[0] + (size - common) * repeats[1]

    def variable_tokens(size: int) -> int:
        commons = repeats[0] * int(word_cumulative[common])
        rest = repeats[1] * int(word_cumulative[size] - word_cumulative[common])
        return int(number_cumulative[entries(size)]) + commons + rest

    def build(size: int) -> Prompt:
        size = max(size, common)
        drawn = order[:size]
        positions = _repeat_list(ctx, size, common, repeats)
        text = _numbered_text([words[i] for i in drawn[positions]])
        ids = _interleave(numbers, ctx.cwe_word_ids, drawn[positions])
        segments: list[Segment] = [head, Piece(ids, text.removeprefix("1.")), question]
        return frame_prompt(ctx.encoder, ctx.frame, segments, family.answer_prefix)

    base = len(build(common).input_ids) - variable_tokens(common)
    size, prompt = fit_prompt(
        build,
        lambda n: base + variable_tokens(max(n, common)),
        length,
        family.tokens_to_generate,
        len(words),
        task.name,
    )
    return prompt, [words[i] for i in order[:common]], {"haystack_size": max(size, common)}


POOL_WORDS = 1 << 16


def _coded_pool(ctx: RulerContext, letters: int, vocab_size: int) -> tuple[list[str], Ragged]:
    """Distinct random lower-case words, sorted, tokenised once per context: at least
    POOL_WORDS and 4x the vocabulary (the size depends on the length only). A sample's
    vocabulary is drawn from it without replacement, not drawn afresh (tokenising thousands
    of fresh words per sample costs more than the rest of the sample)."""
    size = max(POOL_WORDS, 1 << (4 * vocab_size - 1).bit_length())
    key = ("fwe-pool", letters, size)
    if key not in ctx.memo:
        rng = np.random.default_rng([ctx.seed, zlib.crc32(repr(key).encode())])
        words: set[str] = set()
        while len(words) < size:
            codes = rng.integers(0, 26, (size - len(words), letters), dtype=np.uint8) + ord("a")
            words.update(codes.view(f"S{letters}").ravel().astype(str).tolist())
        ordered = sorted(words)
        ctx.memo[key] = (ordered, ctx.encoder.ragged_words([" " + word for word in ordered]))
    return ctx.memo[key]  # type: ignore[return-value]


def riemann_zeta(alpha: float) -> float:
    """zeta(alpha), alpha > 1: torch's Hurwitz zeta at q = 1 (RULER calls scipy.special.zeta;
    the two agree to 1 ulp at alpha 1.5-3), so the GPU image needs no 35 MB scipy wheel."""
    import torch

    one = torch.tensor(1.0, dtype=torch.float64)
    return float(torch.special.zeta(torch.tensor(float(alpha), dtype=torch.float64), one))


def fwe_sample(ctx: RulerContext, task: Task, length: int, index: int) -> tuple[Prompt, list[str], dict]:
    rng = ctx.rng(task.name, length, index)
    family = FAMILIES["freq_words_extraction"]
    alpha, letters = task.args["alpha"], task.args["coded_wordlen"]
    vocab_size = (length - family.tokens_to_generate) // 50
    if vocab_size < 4:
        from longctx.eval.ruler.tokens import RulerPromptTooShortError

        raise RulerPromptTooShortError(
            f"task {task.name!r}: length={length} gives a vocabulary of {vocab_size} words (< 4)"
        )
    pool_words, pool_ids = _coded_pool(ctx, letters, vocab_size)
    chosen = np.sort(rng.choice(len(pool_words), vocab_size, replace=False))  # pool is sorted: sorted(set(vocab))
    chosen = chosen[ctx.fixed_permutation(vocab_size)]
    vocab = [pool_words[i] for i in chosen]
    vocab[0] = "..."
    noise = ctx.encoder.ids(" ...")
    word_ids = Ragged([])
    word_ids.lengths = pool_ids.lengths[chosen].copy()
    word_ids.lengths[0] = len(noise)
    word_ids.offsets = np.concatenate([[0], np.cumsum(word_ids.lengths)])
    word_ids.flat = np.concatenate([noise, pool_ids.gather(chosen[1:])])
    weights = np.arange(1, vocab_size + 1, dtype=np.float64) ** -alpha / riemann_zeta(alpha)

    def counts(size: int) -> np.ndarray:
        return (size * weights).astype(np.int64)

    head, question = family.template.split("{context}")
    head = head.removesuffix(" ")

    def build(size: int) -> Prompt:
        sequence = np.repeat(np.arange(vocab_size), counts(size))
        sequence = sequence[ctx.fixed_permutation(len(sequence))]
        if not len(sequence):
            return frame_prompt(ctx.encoder, ctx.frame, [head, question], family.answer_prefix)
        # the last word goes in as text, so " ..." + "\n" tokenise together
        body = Piece(word_ids.gather(sequence[:-1]), " " + " ".join(map(vocab.__getitem__, sequence[:-1].tolist())))
        if len(sequence) == 1:
            body = Piece(body.ids, "")
        segments: list[Segment] = [head, body, " " + vocab[sequence[-1]] + question]
        return frame_prompt(ctx.encoder, ctx.frame, segments, family.answer_prefix)

    base = len(build(0).input_ids)
    size, prompt = fit_prompt(
        build,
        lambda n: base + int((counts(n) * word_ids.lengths).sum()),
        length,
        family.tokens_to_generate,
        2 * length,
        task.name,
    )
    return prompt, vocab[1:4], {"haystack_size": size, "vocab_size": vocab_size}
