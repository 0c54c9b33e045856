"""The haystack of the NIAH test: a text tokenised once, sentence by sentence (`Haystack`),
by default the Paul Graham essays of gkamradt's tester (STRING §3, eval/essays.py).
eval/niah/generator.py slices it for every prompt length.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from longctx.data.sentences import split_sentences
from longctx.eval.essays import paul_graham_text
from longctx.eval.niah.needles import NiahError
from longctx.eval.prompt_frame import TextTokenizer


@dataclass(frozen=True)
class Haystack:
    """A text tokenised once, sentence by sentence: `ids` and the token index of every sentence start."""

    name: str
    tokenizer_name: str
    ids: np.ndarray
    """int64 [N]: all sentences' ids, concatenated."""
    sentence_starts: np.ndarray
    """int64 [S]: index in `ids` where each sentence starts (ascending, the first is 0)."""

    @classmethod
    def from_pieces(cls, tokenizer: TextTokenizer, pieces: Sequence[str], name: str) -> Haystack:
        """Each piece (sentence, JSON pair) tokenised on its own, then concatenated."""
        token_lists = [ids for ids in tokenizer.encode_batch(pieces) if ids]
        if not token_lists:
            raise NiahError(f"haystack {name!r} has no tokens")
        lengths = np.array([len(ids) for ids in token_lists], dtype=np.int64)
        ids = np.fromiter((i for ids in token_lists for i in ids), dtype=np.int64, count=int(lengths.sum()))
        return cls(name, tokenizer.name, ids, np.concatenate([[0], np.cumsum(lengths)[:-1]]))

    @classmethod
    def from_text(cls, tokenizer: TextTokenizer, text: str, name: str = "text") -> Haystack:
        return cls.from_pieces(tokenizer, split_sentences(text), name)

    @classmethod
    def from_file(cls, tokenizer: TextTokenizer, path: str | Path) -> Haystack:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"haystack file {path} does not exist")
        return cls.from_text(tokenizer, path.read_text(encoding="utf-8"), name=path.name)

    @classmethod
    def paul_graham(cls, tokenizer: TextTokenizer) -> Haystack:
        return cls.from_text(tokenizer, paul_graham_text(), name="paul-graham-essays")

    def region(self, start_sentence: int, num_tokens: int) -> tuple[np.ndarray, np.ndarray]:
        """`num_tokens` ids from sentence `start_sentence` on, wrapping around at the end, and
        the sentence starts inside them (relative, ascending, the first is 0)."""
        total = len(self.ids)
        offset = int(self.sentence_starts[start_sentence])
        ids = self.ids[(offset + np.arange(num_tokens)) % total]
        laps = (offset + num_tokens) // total + 1
        starts = (self.sentence_starts[None, :] + total * np.arange(laps)[:, None]).ravel() - offset
        return ids, starts[(starts >= 0) & (starts < max(num_tokens, 1))]
