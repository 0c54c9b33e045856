"""RULER's variable tracking, `vt` (NVIDIA/RULER scripts/data/synthetic/variable_tracking.py).

A chain of num_hops + 1 = 5 variables, "VAR AAAAA = 12345" then "VAR BBBBB = VAR AAAAA " ...
(five random upper-case letters each, all distinct; the value uniform in [10000, 99999)),
goes into n noise sentences at sorted random sentence indices, lines joined by "\\n"; the
outputs are the 5 names. One in-context example comes first: the same task on a noise
haystack that fits 500 tokens (its own tokens, no frame), with 3-letter names and the value
12345, followed by " " + its answer + "\\n"; every sample renames the example's variables
and value at random (RULER's `randomize_icl`, a plain text replace) and puts it before the
task text, separated by "\\n". 30 tokens to generate.
"""

from __future__ import annotations

import string
import zlib

import numpy as np

from longctx.eval.ruler.constants import FAMILIES, NOISE, STRING_VT_ANSWER_PREFIX, Task
from longctx.eval.ruler.context import RulerContext
from longctx.eval.ruler.tokens import Piece, Prompt, Segment, fit_prompt, frame_prompt, largest_fitting

ICL_TOKENS = 500
_LETTERS = np.array(list(string.ascii_uppercase))


def _names(rng: np.random.Generator, count: int, letters: int) -> list[str]:
    names: list[str] = []
    while len(names) < count:
        name = "".join(rng.choice(_LETTERS, letters))
        if name not in names:
            names.append(name)
    return names


def _chains(rng: np.random.Generator, num_chains: int, num_hops: int, icl: bool) -> tuple[list[list[str]], list]:
    names = _names(rng, (num_hops + 1) * num_chains, 3 if icl else 5)
    groups = [names[i : i + num_hops + 1] for i in range(0, len(names), num_hops + 1)]
    chains = []
    for group in groups:
        value = "12345" if icl else str(int(rng.integers(10000, 99999)))
        chains.append(
            [f"VAR {group[0]} = {value}", *(f"VAR {group[j + 1]} = VAR {group[j]} " for j in range(num_hops))]
        )
    return groups, chains


def _context_segments(noise: Piece, size: int, chains: list[list[str]], position_seed: int) -> list[Segment]:
    """n noise sentences with each chain's lines inserted at sorted random indices, one line each."""
    draw = np.random.default_rng(position_seed)
    slots: list[str | None] = [None] * size
    for chain in chains:
        count = len(slots)
        chosen = draw.choice(count, len(chain), replace=False) if count >= len(chain) else np.zeros(len(chain))
        for j, position in enumerate(sorted(int(p) for p in chosen)):
            slots.insert(position + j, chain[j] + "\n")
    segments: list[Segment] = []
    run = 0
    for slot in [*slots, ""]:
        if slot is None:
            run += 1
            continue
        if run:
            segments.append(Piece(np.tile(noise.ids, run), noise.text * run))
            run = 0
        segments.append(slot)
    return segments


def _texts(ctx: RulerContext, value: str, num_v: int) -> tuple[str, str, str]:
    family = FAMILIES["variable_tracking"]
    head, question = family.template.split("{context}")
    prefix = STRING_VT_ANSWER_PREFIX if ctx.options.copy == "string" else family.answer_prefix
    return head, question.removeprefix("\n").format(query=value), prefix.format(num_v=num_v, query=value)


def _icl_example(ctx: RulerContext, task: Task) -> str:
    """The in-context example (text), drawn once per seed."""
    key = ("vt-icl", task.args["num_chains"], task.args["num_hops"])
    if key in ctx.memo:
        return str(ctx.memo[key])
    rng = np.random.default_rng([ctx.seed, zlib.crc32(b"vt-icl")])
    groups, chains = _chains(rng, task.args["num_chains"], task.args["num_hops"], icl=True)
    position_seed = int(rng.integers(2**63))
    head, question, prefix = _texts(ctx, "12345", task.args["num_hops"] + 1)
    noise = ctx.encoder.piece(NOISE + "\n")

    def text(size: int) -> str:
        segments = [head, *_context_segments(noise, size, chains, position_seed), question + prefix]
        return "".join(s if isinstance(s, str) else s.text for s in segments)

    size = largest_fitting(lambda n: len(ctx.tokenizer.encode(text(n))), ICL_TOKENS, ICL_TOKENS)
    example = text(max(size, 0)) + " " + " ".join(groups[0]) + "\n"
    ctx.memo[key] = example
    return example


def _randomize_icl(example: str, num_hops: int, rng: np.random.Generator) -> str:
    for name in example.strip().split()[-num_hops - 1 :]:
        example = example.replace(name, "".join(rng.choice(_LETTERS, len(name))))
    return example.replace("12345", str(int(rng.integers(10000, 99999))))


def vt_sample(ctx: RulerContext, task: Task, length: int, index: int) -> tuple[Prompt, list[str], dict]:
    rng = ctx.rng(task.name, length, index)
    num_hops = task.args["num_hops"]
    groups, chains = _chains(rng, task.args["num_chains"], num_hops, icl=False)
    value = chains[0][0].split("=")[-1].strip()
    position_seed = int(rng.integers(2**63))
    example = _randomize_icl(_icl_example(ctx, task), num_hops, rng)
    head, question, answer_prefix = _texts(ctx, value, num_hops + 1)
    noise = ctx.encoder.piece(NOISE + "\n")

    def build(size: int) -> Prompt:
        segments = [example + "\n" + head, *_context_segments(noise, size, chains, position_seed), question]
        return frame_prompt(ctx.encoder, ctx.frame, segments, answer_prefix)

    fixed = len(build(0).input_ids)
    reserve = FAMILIES["variable_tracking"].tokens_to_generate
    per = len(noise.ids)
    size, prompt = fit_prompt(build, lambda n: fixed + n * per, length, reserve, length, task.name)
    return prompt, list(groups[0]), {"haystack_size": size, "icl_example": example}
