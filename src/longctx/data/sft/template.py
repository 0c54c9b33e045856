"""The chat template and tokenised chat samples (SkipAlign §3.1, Eq. 1).

A conversation renders with Tulu's template and this tokenizer's EOS:

    <|system|>\\n{content}\\n<|user|>\\n{content}\\n<|assistant|>\\n{content}<EOS><|user|>\\n...

The role markers are plain text (the BPE tokenizer has only EOS and pad as special
tokens). Consecutive system/user messages and the assistant header that follows them form
one `instruction` block; an assistant message's content plus EOS is a `response` block,
so blocks alternate and always start with an instruction. Each block is tokenised on its
own, which makes block boundaries exact (a BPE merge never spans two blocks); the ids can
differ from tokenising the whole rendered text at the seams, and a prompt for generation
must be built the same way: a conversation ending in a user turn renders its last
instruction block with the assistant header, ready for the model to answer.

Labels, next-token convention of the batch contract: labels[t] = input_ids[t + 1] if
token t + 1 is a response token, else IGNORE_INDEX; the last token of a sample gets
IGNORE_INDEX. So exactly the assistant content tokens and the EOS ending each response
are predicted (SkipAlign Eq. 1), the first of them from the last token of the assistant
header. Samples longer than `max_sample_length` (4096 in the paper, §4) are cut there; a
sample left without a response token is dropped and counted.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from longctx.batch import IGNORE_INDEX
from longctx.data.positions import INSTRUCTION, RESPONSE
from longctx.data.sft.jsonl import EMBEDDED, SFTDataError, SFTReport, read_conversations
from longctx.data.sft.synthetic import EMBEDDED_SAMPLES, embedded_conversations
from longctx.data.tokenizer import Tokenizer

log = logging.getLogger("longctx.data.sft")

ASSISTANT_HEADER = "<|assistant|>\n"


@dataclass(frozen=True, eq=False)
class ChatSample:
    """A tokenised conversation: blocks alternating between instruction and response."""

    input_ids: np.ndarray
    """int64 [n]: the blocks' tokens end to end."""
    block_lengths: tuple[int, ...]
    """Tokens per block (each >= 1, sum n)."""
    roles: tuple[str, ...]
    """`instruction` or `response` per block."""

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def response_mask(self) -> np.ndarray:
        """bool [n]: tokens of response blocks (assistant content and its EOS)."""
        return np.repeat(np.array([role == RESPONSE for role in self.roles]), self.block_lengths)

    @property
    def labels(self) -> np.ndarray:
        """int64 [n]: labels[t] = input_ids[t + 1] where token t + 1 is a response token, else -100."""
        labels = np.full(len(self), IGNORE_INDEX, dtype=np.int64)
        labels[:-1] = np.where(self.response_mask[1:], self.input_ids[1:], IGNORE_INDEX)
        return labels

    def truncated(self, max_length: int) -> ChatSample:
        """The first max_length tokens (the block crossing the limit is cut, later ones dropped)."""
        ends = np.cumsum(self.block_lengths)
        kept = int(np.searchsorted(ends, max_length)) + 1  # blocks that start before the limit
        lengths = list(self.block_lengths[:kept])
        lengths[-1] -= int(ends[kept - 1]) - max_length
        return ChatSample(self.input_ids[:max_length], tuple(lengths), self.roles[:kept])


def render_blocks(messages: Sequence[Mapping[str, str]]) -> list[tuple[str, str]]:
    """(role, text) blocks of the template; response texts exclude the EOS added at tokenisation."""
    blocks, pending = [], ""
    for message in messages:
        if message["role"] == "assistant":
            blocks += [(INSTRUCTION, pending + ASSISTANT_HEADER), (RESPONSE, message["content"])]
            pending = ""
        else:
            pending += f"<|{message['role']}|>\n{message['content']}\n"
    if pending:
        blocks.append((INSTRUCTION, pending + ASSISTANT_HEADER))
    return blocks


def tokenize_conversations(
    conversations: Sequence[Sequence[Mapping[str, str]]], tokenizer: Tokenizer
) -> list[ChatSample]:
    """Render and tokenise conversations, one block at a time (one batched encode for all)."""
    rendered = [render_blocks(messages) for messages in conversations]
    encoded = iter(tokenizer.encode_batch([text for blocks in rendered for _, text in blocks]))
    samples = []
    for blocks in rendered:
        pieces = [next(encoded) + ([tokenizer.eos_id] if role == RESPONSE else []) for role, _ in blocks]
        samples.append(
            ChatSample(
                np.array([token for piece in pieces for token in piece], dtype=np.int64),
                tuple(len(piece) for piece in pieces),
                tuple(role for role, _ in blocks),
            )
        )
    return samples


def load_sft_samples(
    source: str | Path,
    tokenizer: Tokenizer,
    *,
    max_sample_length: int = 4096,
    on_bad_sample: str = "skip",
    embedded_samples: int = EMBEDDED_SAMPLES,
    seed: int = 0,
) -> tuple[list[ChatSample], SFTReport]:
    """Tokenised, truncated samples of `source` (a JSONL path or "embedded") and their report.

    `embedded_samples` and `seed` size and seed the embedded set; they are unused for a file.
    """
    if isinstance(max_sample_length, bool) or not isinstance(max_sample_length, int) or max_sample_length < 2:
        raise ValueError(f"max_sample_length must be an int >= 2, got {max_sample_length!r}")
    if str(source) == EMBEDDED:
        report = SFTReport(f"{EMBEDDED} (samples={embedded_samples}, seed={seed})")
        conversations = embedded_conversations(embedded_samples, seed)
        report.conversations = len(conversations)
    else:
        report = SFTReport(str(source))
        conversations = read_conversations(source, on_bad_sample, report)
    samples = []
    for sample in tokenize_conversations(conversations, tokenizer):
        if len(sample) > max_sample_length:
            report.truncated += 1
            sample = sample.truncated(max_sample_length)
        if (sample.labels != IGNORE_INDEX).any():
            samples.append(sample)
        else:
            report.without_labels += 1
    report.samples = len(samples)
    (log.warning if report.bad or report.without_labels else log.info)("SFT data %s", report.summary())
    if not samples:
        raise SFTDataError(f"no usable SFT sample: {report.summary()}")
    return samples, report
