"""RULER's eight needle-in-a-haystack tasks (NVIDIA/RULER scripts/data/synthetic/niah.py).

Needles: "One of the special magic {numbers|words|uuids} for {key} is: {value}."; keys are
words ("adjective-noun" from wonderwords) or UUIDs, values 7-digit numbers, words or UUIDs;
num_needle_k keys with num_needle_v values each (num_needle_k >= num_needle_q), in one
shuffled order; num_needle_q keys are asked for ("a, b, and c"), and their values, in query
order, are the outputs. With one answer (q * v == 1) the template turns singular ("Some" ->
"A", "are all" -> "is", "are" -> "is", "numbers" -> "number").

Haystacks:
- essay: the first n essay words; the needles go between sentences, at sentence index
  int(S * d / 100) for depths d drawn without replacement from RULER's 40 depths
  round(linspace(0, 100, 40)) (S: the sentences of the n-word text), all joined by " ".
- noise: n copies of the noise sentence; needles at random sentence indices; joined by "\\n".
- needle: n needles with random keys and values (niah_multikey_2/3), the real ones at random
  indices; joined by "\\n". The haystack needles of a sample are drawn without replacement
  from a pool of random needles tokenised once per context (at least `length` tokens of
  them), not drawn afresh: tokenising 128K tokens of fresh needles per sample costs seconds.
n is the largest count for which prompt + 128 tokens to generate fit the length.
"""

from __future__ import annotations

import zlib

import numpy as np

from longctx.eval.prompt_pieces import NOISE, Piece, Ragged, Segment, spoken_list
from longctx.eval.ruler.constants import DEPTHS, FAMILIES, NIAH_NEEDLE, Task
from longctx.eval.ruler.context import RulerContext
from longctx.eval.ruler.tokens import Prompt, fit_prompt, frame_prompt

_NEEDLE_CHUNK = 512


def _singular(text: str) -> str:
    return text.replace("Some", "A").replace("are all", "is").replace("are", "is").replace("answers", "answer")


def niah_sample(ctx: RulerContext, task: Task, length: int, index: int) -> tuple[Prompt, list[str], dict]:
    args = task.args
    rng = ctx.rng(task.name, length, index)
    kind_k, kind_v = args["type_needle_k"], args["type_needle_v"]
    keys, values, needles = [], [], []
    for _ in range(args["num_needle_k"]):
        keys.append(ctx.random_value(kind_k, rng))
        values.append([ctx.random_value(kind_v, rng) for _ in range(args["num_needle_v"])])
        needles += [NIAH_NEEDLE.format(type_needle_v=kind_v, key=keys[-1], value=v) for v in values[-1]]
    needles = [needles[i] for i in ctx.fixed_permutation(len(needles))]
    asked = [int(i) for i in rng.choice(args["num_needle_k"], args["num_needle_q"], replace=False)]
    outputs = [v for i in asked for v in values[i]]
    query = spoken_list([keys[i] for i in asked])

    family = FAMILIES["niah"]
    template, answer_prefix, kind_text = family.template, family.answer_prefix, kind_v
    if args["num_needle_q"] * args["num_needle_v"] == 1:
        template, answer_prefix, kind_text = _singular(template), _singular(answer_prefix), kind_v[:-1]
    head, question = template.format(type_needle_v=kind_text, context="\x00", query=query).split("\x00")
    answer_prefix = answer_prefix.format(type_needle_v=kind_text, query=query)
    question = question.removeprefix("\n")  # the context's last sentence carries the newline

    haystack = args["type_haystack"]
    depth_draw = rng.choice(DEPTHS, len(needles), replace=False)
    index_seed = int(rng.integers(2**63))
    reserve = family.tokens_to_generate
    if haystack == "essay":
        size, prompt = _essay(ctx, task, length, head, question, answer_prefix, needles, depth_draw, reserve)
        return prompt, outputs, {"haystack_size": size}
    sentences = None
    if haystack == "needle":
        pool = _needle_pool(ctx, kind_k, kind_v, length)
        sentences = _NeedleSentences(pool, rng.permutation(len(pool[0])))
    noise = ctx.encoder.piece(NOISE + "\n")

    def build(size: int) -> Prompt:
        # RULER: random.sample(range(n), k) sorted descending, each needle inserted at its index
        draw = np.random.default_rng(index_seed)
        chosen = draw.choice(size, len(needles), replace=False) if size >= len(needles) else [0] * len(needles)
        positions = sorted((int(i) for i in chosen), reverse=True)
        slots: list[Segment | None] = [None] * size
        for position, needle in zip(positions, needles, strict=True):
            slots.insert(position, needle + "\n")
        segments: list[Segment] = [head]
        run = 0
        for slot_index, slot in enumerate(slots):
            if slot is not None:
                if run:
                    segments.append(_run(noise, sentences, slot_index - run, run))
                segments.append(slot)
                run = 0
            else:
                run += 1
        if run:
            segments.append(_run(noise, sentences, len(slots) - run, run))
        return frame_prompt(ctx.encoder, ctx.frame, [*segments, question], answer_prefix)

    fixed = len(build(0).input_ids)
    if sentences is None:
        per = len(noise.ids)
        size, prompt = fit_prompt(build, lambda n: fixed + n * per, length, reserve, length, task.name)
    else:
        size, prompt = fit_prompt(
            build, lambda n: fixed + int(sentences.cumulative[n]), length, reserve, sentences.count, task.name
        )
    return prompt, outputs, {"haystack_size": size}


class _NeedleSentences:
    """One sample's haystack needles: pool entries in a random order."""

    def __init__(self, pool: tuple[list[str], Ragged], order: np.ndarray):
        self.texts, self.ids = pool
        self.order = order
        self.cumulative = np.concatenate([[0], np.cumsum(self.ids.lengths[order])])
        self.count = len(order)


def _needle_pool(ctx: RulerContext, kind_k: str, kind_v: str, length: int) -> tuple[list[str], Ragged]:
    """Random needles ("One of the special magic ... for KEY is: VALUE.\\n") tokenised once per
    context: the first chunks of a fixed stream (chunk c drawn from [seed, kind, c]) that hold
    more than `length` tokens, so a sample depends on its length only."""
    stream_key = ("niah-needle-stream", kind_k, kind_v)
    stream: tuple[list[str], list[list[int]], list[int]] = ctx.memo.setdefault(stream_key, ([], [], [0]))  # type: ignore[assignment]
    texts, token_lists, totals = stream
    while totals[-1] <= length:
        rng = np.random.default_rng([ctx.seed, zlib.crc32(repr(stream_key).encode()), len(totals) - 1])
        chunk = [
            NIAH_NEEDLE.format(
                type_needle_v=kind_v, key=ctx.random_value(kind_k, rng), value=ctx.random_value(kind_v, rng)
            )
            + "\n"
            for _ in range(_NEEDLE_CHUNK)
        ]
        encoded = ctx.tokenizer.encode_batch(chunk)
        texts += chunk
        token_lists += encoded
        totals.append(totals[-1] + sum(map(len, encoded)))
    chunks = int(np.searchsorted(totals, length, side="right"))
    pool_key = ("niah-needle-pool", kind_k, kind_v, chunks)
    if pool_key not in ctx.memo:
        ctx.memo[pool_key] = (texts[: chunks * _NEEDLE_CHUNK], Ragged(token_lists[: chunks * _NEEDLE_CHUNK]))
    return ctx.memo[pool_key]  # type: ignore[return-value]


def _run(noise: Piece, sentences: _NeedleSentences | None, start: int, count: int) -> Piece:
    if sentences is None:
        return Piece(np.tile(noise.ids, count), noise.text * count)
    chosen = sentences.order[start : start + count]
    return Piece(sentences.ids.gather(chosen), "".join(sentences.texts[i] for i in chosen))


def _essay(
    ctx: RulerContext,
    task: Task,
    length: int,
    head: str,
    question: str,
    answer_prefix: str,
    needles: list[str],
    depths: np.ndarray,
    reserve: int,
) -> tuple[int, Prompt]:
    question = "\n" + question

    def build(num_words: int) -> Prompt:
        starts = ctx.essay.sentence_starts_before(num_words)
        count = len(starts)
        points = sorted(int(count * (int(d) / 100)) for d in depths)
        bounds = [0, *(int(starts[p]) if p < count else num_words for p in points), num_words]
        segments: list[Segment] = [head]
        for part in range(len(bounds) - 1):
            start, stop = bounds[part], bounds[part + 1]
            last = part == len(bounds) - 2 and stop > start
            # the essay's last word goes in as text, so "word." + "\n" tokenise together
            ids, text = ctx.essay_run(start, stop - 1 if last else stop, first=part == 0)
            if part > 0 and start == stop:
                segments.append(" ")
            elif len(ids) or text:
                segments.append(Piece(ids, text))
            if last:
                word = ctx.essay.words[(stop - 1) % len(ctx.essay.words)]
                segments.append(word if part == 0 and stop - 1 == start else " " + word)
            if part < len(needles):
                segments.append(" " + needles[part])
        return frame_prompt(ctx.encoder, ctx.frame, [*segments, question], answer_prefix)

    fixed = len(build(0).input_ids)
    upper = 4 * length
    return fit_prompt(build, lambda n: fixed + ctx.essay_tokens(n), length, reserve, upper, task.name)
