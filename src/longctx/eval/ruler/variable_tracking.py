"""RULER's variable tracking, `vt` (NVIDIA/RULER scripts/data/synthetic/variable_tracking.py).

A chain of num_hops + 1 = 5 variables, "VAR AAAAA = 12345" then "VAR BBBBB = VAR AAAAA " ...
(five random upper-case letters each, all distinct; the value uniform in [10000, 99999)),
goes into n noise sentences at sorted random sentence indices (distinct, so a noise line
follows every chain line); the outputs are the 5 names. One in-context example comes
first: the same task on a shorter noise haystack with 3-letter names, followed by its
answer. 30 tokens to generate.

The two reference copies (`RulerOptions.copy`) lay the prompt out differently (`Layout`):

- ruler (NVIDIA/RULER today): lines joined by "\\n". The example fits 500 tokens (its own
  tokens, no frame), has the value 12345 and ends " " + answer + "\\n"; every sample
  renames its variables and value at random (RULER's `randomize_icl`, a plain text
  replace) and puts it before the task text, separated by "\\n".
- string (HKUNLP/STRING `ruler/`, RULER at 5973c2a): the context is the noise lines (each
  ending "\\n") and the chain lines joined by " " (" The grass ...\\n", "VAR B = VAR A  The
  grass", two spaces), and the template's own "\\n" before "Question" stays (a blank line).
  The example is the template with its whitespace collapsed and its last word ("above.")
  cut, " " + answer + "\\n\\n" after it; it is drawn once (a random value) and shared by
  every sample, which reads " " + example + "\\n\\n" + task. Its noise comes in steps of 5
  lines, the most with tokens(example + " " + str(answer list)) + 30 <= 500. The answer
  prefix spells "assgined".
"""

from __future__ import annotations

import string
import zlib
from dataclasses import dataclass

import numpy as np

from longctx.eval.prompt_pieces import NOISE, Piece, Segment
from longctx.eval.ruler.constants import FAMILIES, STRING_VT_ANSWER_PREFIX, Task
from longctx.eval.ruler.context import RulerContext
from longctx.eval.ruler.tokens import Prompt, fit_prompt, frame_prompt, largest_fitting

ICL_TOKENS = 500
TOKENS_TO_GENERATE = FAMILIES["variable_tracking"].tokens_to_generate
_LETTERS = np.array(list(string.ascii_uppercase))


@dataclass(frozen=True)
class Layout:
    """Where the copies of RULER's vt generator put whitespace (module docstring)."""

    join: str
    """Between two context items (noise or chain lines)."""
    chain_end: str
    """After a chain line (a noise line always ends "\\n")."""
    blank_line_before_question: bool
    """The template's "\\n" before "Question" kept after the last line's "\\n"."""
    example_lead: str
    """Before the example (inside the chat turn, where the copy inserts it)."""
    example_end: str
    """After the example's answer."""
    separator: str
    """Between the example and the task text."""
    answer_prefix: str


LAYOUTS = {
    "ruler": Layout("", "\n", False, "", "\n", "\n", FAMILIES["variable_tracking"].answer_prefix),
    "string": Layout(" ", "", True, " ", "\n\n", "\n\n", STRING_VT_ANSWER_PREFIX),
}


def _names(rng: np.random.Generator, count: int, letters: int) -> list[str]:
    names: list[str] = []
    while len(names) < count:
        name = "".join(rng.choice(_LETTERS, letters))
        if name not in names:
            names.append(name)
    return names


def _chains(
    rng: np.random.Generator, num_chains: int, num_hops: int, letters: int, value: str | None = None
) -> tuple[list[list[str]], list]:
    """Names and chain lines; `value` fixes the first line's value (else drawn per chain)."""
    names = _names(rng, (num_hops + 1) * num_chains, letters)
    groups = [names[i : i + num_hops + 1] for i in range(0, len(names), num_hops + 1)]
    chains = []
    for group in groups:
        first = value or str(int(rng.integers(10000, 99999)))
        chains.append(
            [f"VAR {group[0]} = {first}", *(f"VAR {group[j + 1]} = VAR {group[j]} " for j in range(num_hops))]
        )
    return groups, chains


def _slots(size: int, chains: list[list[str]], position_seed: int) -> list[str | None]:
    """`size` noise slots (None) with each chain's lines inserted at sorted random indices."""
    draw = np.random.default_rng(position_seed)
    slots: list[str | None] = [None] * size
    for chain in chains:
        count = len(slots)
        chosen = draw.choice(count, len(chain), replace=False) if count >= len(chain) else np.zeros(len(chain))
        for j, position in enumerate(sorted(int(p) for p in chosen)):
            slots.insert(position + j, chain[j])
    return slots


def _context_segments(
    ctx: RulerContext, layout: Layout, size: int, chains: list[list[str]], position_seed: int
) -> list[Segment]:
    """The context's items joined as `layout` says. Runs of noise lines are one Piece; the
    first and last items are text, so that they tokenise with the template around them (a
    Piece ends where the pre-tokenizer cuts anyway, and ".\\n" + "\\nQuestion" is one ".\\n\\n")."""
    slots = _slots(size, chains, position_seed)
    noise = ctx.encoder.piece(layout.join + NOISE + "\n")
    segments: list[Segment] = []
    run = 0
    for i, slot in enumerate(slots):
        if slot is None and 0 < i < len(slots) - 1:
            run += 1
            continue
        if run:
            segments.append(Piece(np.tile(noise.ids, run), noise.text * run))
            run = 0
        line = NOISE + "\n" if slot is None else slot + layout.chain_end
        segments.append((layout.join if i else "") + line)
    return segments


def _context_text(ctx: RulerContext, layout: Layout, size: int, chains: list[list[str]], position_seed: int) -> str:
    return "".join(
        s if isinstance(s, str) else s.text for s in _context_segments(ctx, layout, size, chains, position_seed)
    )


def _texts(layout: Layout, value: str, num_v: int) -> tuple[str, str, str]:
    """Template head, question and answer prefix of the task."""
    head, question = FAMILIES["variable_tracking"].template.split("{context}")
    if not layout.blank_line_before_question:
        question = question.removeprefix("\n")
    return head, question.format(query=value), layout.answer_prefix.format(num_v=num_v, query=value)


def _example_rng(ctx: RulerContext) -> np.random.Generator:
    return np.random.default_rng([ctx.seed, zlib.crc32(b"vt-icl")])


def _ruler_example(ctx: RulerContext, task: Task, layout: Layout) -> str:
    """RULER's example: the task text with 3-letter names and the value 12345, as much noise
    as fits ICL_TOKENS, its answer after it."""
    rng = _example_rng(ctx)
    groups, chains = _chains(rng, task.args["num_chains"], task.args["num_hops"], 3, value="12345")
    position_seed = int(rng.integers(2**63))
    head, question, prefix = _texts(layout, "12345", task.args["num_hops"] + 1)

    def text(size: int) -> str:
        return head + _context_text(ctx, layout, size, chains, position_seed) + question + prefix

    size = largest_fitting(lambda n: len(ctx.tokenizer.encode(text(n))), ICL_TOKENS, ICL_TOKENS)
    return text(max(size, 0)) + " " + " ".join(groups[0]) + layout.example_end


def _string_example(ctx: RulerContext, task: Task, layout: Layout) -> str:
    """The STRING copy's example: its template is the task template's words joined by " "
    without the last one (the copy cuts what it takes for the model template's closing tag,
    which without one is "above."), then the answer prefix. Noise in steps of 5 lines while
    tokens(text + " " + str(names)) + 30 <= 500 (the copy measures the Python list)."""
    rng = _example_rng(ctx)
    groups, chains = _chains(rng, task.args["num_chains"], task.args["num_hops"], 3)
    value = chains[0][0].split("=")[-1].strip()
    position_seed = int(rng.integers(2**63))
    head, question = " ".join(FAMILIES["variable_tracking"].template.split()[:-1]).split("{context}")
    tail = question.format(query=value) + layout.answer_prefix.format(num_v=task.args["num_hops"] + 1, query=value)

    def text(steps: int) -> str:
        return head + _context_text(ctx, layout, 5 * steps, chains, position_seed) + tail

    steps = largest_fitting(
        lambda k: len(ctx.tokenizer.encode(f"{text(k)} {groups[0]}")),
        ICL_TOKENS - TOKENS_TO_GENERATE,
        ICL_TOKENS // 5,  # a step of 5 lines is at least 5 tokens
    )
    return text(max(steps, 0)) + " " + " ".join(groups[0]) + layout.example_end


def _icl_example(ctx: RulerContext, task: Task, layout: Layout) -> str:
    """The in-context example (text), drawn once per seed and copy."""
    key = ("vt-icl", ctx.options.copy, task.args["num_chains"], task.args["num_hops"])
    if key not in ctx.memo:
        make = _string_example if ctx.options.copy == "string" else _ruler_example
        ctx.memo[key] = make(ctx, task, layout)
    return str(ctx.memo[key])


def _randomize_icl(example: str, num_hops: int, rng: np.random.Generator) -> str:
    for name in example.strip().split()[-num_hops - 1 :]:
        example = example.replace(name, "".join(rng.choice(_LETTERS, len(name))))
    return example.replace("12345", str(int(rng.integers(10000, 99999))))


def vt_sample(ctx: RulerContext, task: Task, length: int, index: int) -> tuple[Prompt, list[str], dict]:
    layout = LAYOUTS[ctx.options.copy]
    rng = ctx.rng(task.name, length, index)
    num_hops = task.args["num_hops"]
    groups, chains = _chains(rng, task.args["num_chains"], num_hops, 5)
    value = chains[0][0].split("=")[-1].strip()
    position_seed = int(rng.integers(2**63))
    example = _icl_example(ctx, task, layout)
    if ctx.options.copy == "ruler":
        example = _randomize_icl(example, num_hops, rng)
    head, question, answer_prefix = _texts(layout, value, num_hops + 1)
    lead = layout.example_lead + example + layout.separator + head

    def build(size: int) -> Prompt:
        segments = [lead, *_context_segments(ctx, layout, size, chains, position_seed), question]
        return frame_prompt(ctx.encoder, ctx.frame, segments, answer_prefix)

    fixed = len(build(0).input_ids)
    per = len(ctx.encoder.ids(layout.join + NOISE + "\n"))
    size, prompt = fit_prompt(build, lambda n: fixed + n * per, length, TOKENS_TO_GENERATE, length, task.name)
    return prompt, list(groups[0]), {"haystack_size": size, "icl_example": example}
