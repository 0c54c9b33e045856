"""InfiniteBench's synthetic tasks generated at any length: the prompts of
OpenBMB/InfiniteBench data/construct_synthetic_dataset.py in STRING's Llama templates, cut
to the length by STRING's middle truncation (the sizes and rules: eval/infinitebench/).
"""

from __future__ import annotations

import re
import uuid
import zlib
from dataclasses import dataclass

import numpy as np

from longctx.errors import LongctxError
from longctx.eval.prompt_frame import BARE, PromptFrame, TextTokenizer
from longctx.eval.prompt_pieces import NOISE, Piece, PieceEncoder, Ragged, Segment


class InfiniteBenchError(LongctxError, ValueError):
    """An InfiniteBench sample cannot be built, or a prediction file scored, from these arguments."""


TEMPLATES = {
    "passkey": "There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. "
    "I will quiz you about the important information.\n\n{context}\n\n{input}\n\nThe pass key is",
    "number_string": "There is an important info hidden inside a lot of irrelevant text. Find it. "
    "I will quiz you about the important information there.\n\n{context}\n\n{input}\n\nThe sequence of digits is",
    "kv_retrieval": "Extract the value corresponding to the specified key in the JSON object below.\n\n{context}\n\n{input}",
    "math_find": "{prefix}\n\n{context}\n\n{input}",
}
TOKENS_TO_GENERATE = {"passkey": 6, "number_string": 12, "kv_retrieval": 50, "math_find": 3}
TASKS = tuple(TEMPLATES)
REFERENCE_LENGTH = 131072
_NOISE_STEPS = {326: 6, 652: 12, 1305: 22, 2610: 45, 5220: 90, 10440: 180}
_REPEATS = {"passkey": 5, "number_string": 10}
_ANSWER_SENTENCES = {
    "passkey": ("The pass key is {key}. Remember it. {key} is the pass key.\n", "What is the pass key?"),
    "number_string": (
        "The sequence of digits is {key}. Remember it. {key} is the sequence of digits.\n",
        "What is the sequence of digits?",
    ),
}
MATH_TASKS = (
    "largest number",
    "second largest number",
    "third largest number",
    "smallest number",
    "second smallest number",
    "third smallest number",
    "median",
)
MATH_SAMPLES_PER_TASK = 50
KV_SAMPLES = 500
_POOL_CHUNK = 512


@dataclass(frozen=True)
class InfiniteBenchSample:
    task: str
    length: int
    index: int
    input_ids: np.ndarray
    text: str
    """The prompt text before truncation, without the chat frame."""
    answer: str | int | float
    tokens_to_generate: int
    truncated: int
    """Ids removed from the middle (0 when the prompt fit)."""


def truncate_middle(ids: np.ndarray, max_length: int) -> np.ndarray:
    """STRING / InfiniteBench `truncate_input(..., manner="middle")`: the first and last max_length // 2 ids."""
    if len(ids) <= max_length:
        return ids
    half = max_length // 2
    return np.concatenate([ids[:half], ids[len(ids) - half :]])


class InfiniteBenchGenerator:
    def __init__(self, tokenizer: TextTokenizer, frame: PromptFrame = BARE, seed: int = 0):
        self.tokenizer = tokenizer
        self.encoder = PieceEncoder(tokenizer)
        self.frame = frame
        self.seed = seed
        self._kv_stream: tuple[list[str], list[list[int]], list[int]] = ([], [], [0])
        self._numbers = self.encoder.ragged([f", {n}" for n in range(100)])

    def sample(self, task: str, length: int, index: int) -> InfiniteBenchSample:
        if task not in TEMPLATES:
            raise InfiniteBenchError(f"InfiniteBench task {task!r} is not one of {list(TASKS)}")
        rng = np.random.default_rng([self.seed, zlib.crc32(task.encode()), length, index])
        build = {"passkey": self._retrieval, "number_string": self._retrieval, "kv_retrieval": self._kv}
        segments, answer = build.get(task, self._math)(task, length, index, rng)
        ids, text = self.encoder.assemble(segments)
        head, tail = np.asarray(self.frame.head, dtype=np.int64), np.asarray(self.frame.tail, dtype=np.int64)
        budget = length - len(head) - len(tail)
        if budget <= 0:
            raise InfiniteBenchError(f"InfiniteBench {task}: length={length} cannot hold the chat frame")
        kept = truncate_middle(ids, budget)
        return InfiniteBenchSample(
            task,
            length,
            index,
            np.concatenate([head, kept, tail]),
            text,
            answer,
            TOKENS_TO_GENERATE[task],
            len(ids) - len(kept),
        )

    # ------------------------------------------------------------------ passkey, number_string

    def _retrieval(self, task: str, length: int, index: int, rng: np.random.Generator) -> tuple[list[Segment], str]:
        count = round(length * 5220 / REFERENCE_LENGTH)
        step = _NOISE_STEPS.get(count, max(1, round(count / 58)))
        depth = ((index // _REPEATS[task]) * step) % (count + 1)
        digits = [str(int(d)) for d in rng.integers(0, 10, 5)]
        if task == "number_string":
            for k in range(5):
                position = int(rng.integers(0, 5 + k))
                digits.insert(position, digits[position])
        key = "".join(digits)
        sentence, question = _ANSWER_SENTENCES[task]
        head, tail = TEMPLATES[task].split("{context}")
        noise = self.encoder.piece(NOISE + "\n")
        segments: list[Segment] = [head]
        if depth:
            segments.append(Piece(np.tile(noise.ids, depth), noise.text * depth))
        segments.append(sentence.format(key=key))
        after = count - depth
        if after > 1:
            segments.append(Piece(np.tile(noise.ids, after - 1), noise.text * (after - 1)))
        # the last sentence goes in as text, so ".\n" + "\n\n" tokenise together
        segments += [noise.text if after else "", tail.format(input=question)]
        return segments, key

    # ------------------------------------------------------------------ kv_retrieval

    def _kv_pool(self, tokens: int) -> tuple[list[str], Ragged]:
        """Pairs ' "key": "value",' from a fixed stream (chunk c from [seed, c]), the first
        chunks holding more than `tokens` tokens."""
        texts, token_lists, totals = self._kv_stream
        while totals[-1] <= tokens:
            rng = np.random.default_rng([self.seed, zlib.crc32(b"kv-stream"), len(totals) - 1])
            chunk = []
            for _ in range(_POOL_CHUNK):
                key, value = (str(uuid.UUID(int=int.from_bytes(rng.bytes(16), "big"), version=4)) for _ in range(2))
                chunk.append(f' "{key}": "{value}",')
            texts += chunk
            token_lists += self.tokenizer.encode_batch(chunk)
            totals.append(totals[-1] + sum(map(len, token_lists[-_POOL_CHUNK:])))
        chunks = int(np.searchsorted(totals, tokens, side="right"))
        return texts[: chunks * _POOL_CHUNK], Ragged(token_lists[: chunks * _POOL_CHUNK])

    def _kv(self, task: str, length: int, index: int, rng: np.random.Generator) -> tuple[list[Segment], str]:
        count = max(2, round(length * 2500 / REFERENCE_LENGTH))
        texts, ids = self._kv_pool(length)
        if count > len(texts):
            raise InfiniteBenchError(f"kv_retrieval: {count} pairs exceed the pool of {len(texts)}")
        chosen = rng.choice(len(texts), count, replace=False)
        asked = min(int(index * count / KV_SAMPLES), count - 1) if index < KV_SAMPLES else int(rng.integers(count))
        key, value = texts[chosen[asked]].split('": "')
        key, value = key.removeprefix(' "'), value.removesuffix('",')
        head, tail = TEMPLATES[task].split("{context}")
        first = texts[chosen[0]].removeprefix(" ")
        last = texts[chosen[-1]].removesuffix(",") + "}"
        middle = chosen[1:-1]
        question = f'\nKey: "{key}"\nThe value associated with the specified key is: '
        segments: list[Segment] = [
            head + "JSON data:\n{" + first,
            Piece(ids.gather(middle), "".join(texts[i] for i in middle)),
            last + tail.format(input=question),
        ]
        return segments, value

    # ------------------------------------------------------------------ math_find

    def _math(self, task: str, length: int, index: int, rng: np.random.Generator) -> tuple[list[Segment], int | float]:
        count = max(3, round(length * 60000 / REFERENCE_LENGTH))
        kind = MATH_TASKS[(index // MATH_SAMPLES_PER_TASK) % len(MATH_TASKS)]
        values, answer = _math_list(kind, count, rng)
        prompt_input = (
            f"You should answer with only one number, no other words. The {kind} of the list is: "
            if kind != "median"
            else "You should answer with only one number, no other words. The median number of the list is: "
        )
        target = re.findall(r"The .+ of", prompt_input)[0].lower()[:-3]
        head, tail = (
            TEMPLATES[task]
            .format(prefix=f"What is {target} in the following list?", context="\x00", input="\x01")
            .split("\x00")
        )
        tail_text = tail.replace("\x01", prompt_input)
        rest = values[1:]
        segments: list[Segment] = [
            head + f"[{values[0]}",
            Piece(self._numbers.gather(rest), "".join(", " + v for v in map(str, rest.tolist()))),
            "]" + tail_text,
        ]
        return segments, answer


def _math_list(kind: str, count: int, rng: np.random.Generator) -> tuple[np.ndarray, int | float]:
    """InfiniteBench's generate_random_list on [0, 99]: the list and its answer."""
    low, high = 0, 99
    if "largest" in kind or (kind == "median" and rng.random() <= 0.5):
        high = int(rng.integers(int(99 * 0.8), 100))
    elif "smallest" in kind or kind == "median":
        low = int(rng.integers(0, int(99 * 0.2) + 1))
    values = rng.integers(low, high + 1, count)
    if kind == "median":
        ordered = np.sort(values)
        middle = count // 2
        answer: int | float = (
            int(ordered[middle]) if count % 2 else (int(ordered[middle]) + int(ordered[middle - 1])) / 2
        )
        return values, answer
    distinct = np.unique(values)
    rank = ("third " in kind and 2) or ("second " in kind and 1) or 0
    if rank >= len(distinct):
        rank = len(distinct) - 1
    answer = int(distinct[-1 - rank]) if "largest" in kind else int(distinct[rank])
    return values, answer
