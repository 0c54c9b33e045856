"""Text and token ids -> sentences.

`split_sentences` cuts text (the NIAH haystack, the retrieval filler). The rest serves
LongRecipe's position index transformation (§4.2, Algorithm 1):

Algorithm 1 splits a sample "into N sentences based on delimiters '. ! ? \\n'". The data
path only sees token ids, so the split is a property of the vocabulary: a token ends a
sentence when its text contains a delimiter character (`.`, `!`, `?`, a newline, or
whatever `delimiters` lists), and the next token starts the next sentence. The authors'
code does the same with a fixed list of Llama-3 ids (".", "\\n", "?", "!", ".\\n");
deriving the table from the tokenizer covers every tokenizer and every merged token that
carries a delimiter (e.g. ".\\n\\n" or '?"'). EOS never ends a sentence by itself here:
documents are split by the packer before sentences are.
"""

from __future__ import annotations

import itertools
import re

import numpy as np

from longctx.data.tokenizer import Tokenizer
from longctx.errors import DataError

_SENTENCE_END = re.compile(r"[.!?]+[\"')\]]*(?=\s|[A-Z]|$)")

DEFAULT_DELIMITERS = ".!?\n"
"""LongRecipe Algorithm 1, line 6."""


def sentence_end_table(tokenizer: Tokenizer, delimiters: str = DEFAULT_DELIMITERS) -> np.ndarray:
    """bool [vocab_size]: True for the ids whose text contains a delimiter character."""
    if not delimiters:
        raise ValueError("delimiters is empty: at least one character must end a sentence")
    table = np.zeros(tokenizer.vocab_size, dtype=bool)
    for token_id in range(tokenizer.vocab_size):
        text = tokenizer.decode([token_id])
        table[token_id] = any(character in text for character in delimiters)
    return table


def sentence_lengths(tokens: np.ndarray, ends_sentence: np.ndarray) -> np.ndarray:
    """int64 lengths of the sentences of `tokens` (a sentence ends after each delimiter token;
    the last sentence ends with the tokens, delimiter or not). Sums to len(tokens)."""
    tokens = np.asarray(tokens)
    if tokens.ndim != 1 or len(tokens) == 0:
        raise ValueError(f"tokens must be a non-empty 1-D array, got shape {tokens.shape}")
    if tokens.min() < 0 or tokens.max() >= len(ends_sentence):
        raise DataError(
            f"token ids must lie in [0, {len(ends_sentence)}) (the sentence table's vocabulary), "
            f"got [{int(tokens.min())}, {int(tokens.max())}]"
        )
    ends = np.flatnonzero(ends_sentence[tokens][:-1]) + 1
    return np.diff(np.concatenate([[0], ends, [len(tokens)]])).astype(np.int64)


def split_sentences(text: str) -> list[str]:
    """Pieces ending after [.!?] (plus closing quotes/brackets) that is followed by whitespace,
    a capital letter or the end; the whitespace starts the next piece. "".join(pieces) == text."""
    cuts = [m.end() for m in _SENTENCE_END.finditer(text)]
    bounds = [0, *cuts, len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds) if b > a]
