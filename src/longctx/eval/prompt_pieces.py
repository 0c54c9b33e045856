"""Prompts assembled in token space, from pieces tokenised once: what RULER's and
InfiniteBench's generators share (eval/ruler/tokens.py, eval/infinitebench/generator.py),
below both so that neither imports the other.

Reference generators re-tokenise the whole growing prompt inside a search over the
haystack size (tens of encodes of up to 128K tokens per sample). Here every piece of a
prompt (an essay word, the noise sentence, a needle, a numbered word) is tokenised on its
own and cached, and the prompt's ids are the pieces' ids concatenated. Pieces are cut where
a byte-level BPE's pre-tokenizer cuts anyway (before a space that precedes a word or
number, after a newline that ends a sentence), so for the Llama-3 tokenizer the
concatenation equals tokenising the whole text (the RULER tests in tests/eval/ check it on
every task).

A prompt is a list of segments: `str` (adjacent strings are joined, then tokenised together)
or `Piece` (ids tokenised earlier, with their text).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from longctx.errors import LongctxError
from longctx.eval.prompt_frame import TextTokenizer


@dataclass(frozen=True)
class Piece:
    ids: np.ndarray
    text: str


Segment = str | Piece

NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
"""InfiniteBench's noise sentence (construct_synthetic_dataset.py), which RULER took: its
niah_single_1 and vt haystack, InfiniteBench's passkey and number_string noise."""


def spoken_list(items: Sequence[str]) -> str:
    """Items as a sentence lists them: "a", "a, and b", "a, b, and c" (NIAH's and RULER's query)."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + ", and " + items[-1]


class Ragged:
    """Many short id lists stored flat: `gather(indices)` concatenates the chosen ones."""

    def __init__(self, token_lists: Sequence[Sequence[int]]):
        self.lengths = np.fromiter((len(t) for t in token_lists), dtype=np.int64, count=len(token_lists))
        self.offsets = np.concatenate([[0], np.cumsum(self.lengths)])
        self.flat = np.fromiter((i for t in token_lists for i in t), dtype=np.int64, count=int(self.offsets[-1]))

    def __len__(self) -> int:
        return len(self.lengths)

    def gather(self, indices: np.ndarray) -> np.ndarray:
        indices = np.asarray(indices, dtype=np.int64)
        lengths = self.lengths[indices]
        if not len(indices):
            return np.zeros(0, dtype=np.int64)
        starts = np.repeat(self.offsets[indices] - np.cumsum(lengths) + lengths, lengths)
        return self.flat[starts + np.arange(int(lengths.sum()))]


class PieceEncoder:
    """A tokenizer with a cache of the short strings prompts repeat (templates, noise, numbers)."""

    def __init__(self, tokenizer: TextTokenizer):
        self.tokenizer = tokenizer
        self._cache: dict[str, np.ndarray] = {}

    def ids(self, text: str) -> np.ndarray:
        cached = self._cache.get(text)
        if cached is None:
            cached = np.asarray(self.tokenizer.encode(text), dtype=np.int64)
            if len(text) <= 256:
                self._cache[text] = cached
        return cached

    def piece(self, text: str) -> Piece:
        return Piece(self.ids(text), text)

    def ragged(self, texts: Sequence[str]) -> Ragged:
        return Ragged(self.tokenizer.encode_batch(list(texts)) if texts else [])

    def ragged_words(self, words: Sequence[str]) -> Ragged:
        """`ragged` of pieces that each start at a pre-tokenizer boundary (" word"): one encode
        of their concatenation split by the tokens' character offsets (a batch of thousands
        of short strings costs more); falls back to `ragged` where offsets are unavailable or
        a piece would get no token."""
        try:
            backend = getattr(self.tokenizer, "hf_tokenizer", None)
        except LongctxError:  # a tiktoken encoding
            backend = None
        if backend is None or not words:
            return self.ragged(words)
        encoding = backend.encode("".join(words), add_special_tokens=False)
        starts = np.concatenate([[0], np.cumsum([len(w) for w in words])])
        token_starts = np.array([start for start, _ in encoding.offsets], dtype=np.int64)
        owner = np.searchsorted(starts, token_starts, side="right") - 1
        counts = np.bincount(owner, minlength=len(words))
        if len(counts) != len(words) or not counts.all():
            return self.ragged(words)
        ragged = Ragged([])
        ragged.lengths = counts.astype(np.int64)
        ragged.offsets = np.concatenate([[0], np.cumsum(ragged.lengths)])
        ragged.flat = np.asarray(encoding.ids, dtype=np.int64)
        return ragged

    def assemble(self, segments: Sequence[Segment]) -> tuple[np.ndarray, str]:
        """Ids and text of the segments (adjacent strings tokenised together)."""
        ids: list[np.ndarray] = []
        texts: list[str] = []
        pending: list[str] = []

        def flush() -> None:
            if pending:
                joined = "".join(pending)
                ids.append(self.ids(joined))
                texts.append(joined)
                pending.clear()

        for segment in segments:
            if isinstance(segment, str):
                pending.append(segment)
            else:
                flush()
                ids.append(segment.ids)
                texts.append(segment.text)
        flush()
        return (np.concatenate(ids) if ids else np.zeros(0, dtype=np.int64)), "".join(texts)
