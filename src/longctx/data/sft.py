"""Chat data for SFT and the rows of its variants (SkipAlign §3.1-§4, DESIGN §9 and §11).

This module owns conversations -> tokenised chat samples -> rows of the batch contract
(DESIGN §3) for Normal-SFT, PackedSFT-k and SkipAlign, plus the relative-distance
histogram of such rows (SkipAlign Figure 2).

Data. Tulu-v2 JSONL, one conversation per line: {"messages": [{"role": "system" | "user" |
"assistant", "content": "..."}, ...]} (other keys are ignored, blank lines too). A line
that is not JSON, not such an object, has an unknown role, an empty or non-string content
or no assistant turn is reported with its 1-based line number and skipped
(`on_bad_sample="skip"`) or fails the load (`"error"`); the count is logged. The default
source `"embedded"` is generated here (see below); nothing is downloaded.

Template (Tulu's, with this tokenizer's EOS). A conversation renders as

    <|system|>\\n{content}\\n<|user|>\\n{content}\\n<|assistant|>\\n{content}<EOS><|user|>\\n...

The role markers are plain text (the BPE tokenizer has only EOS and pad as special
tokens). Consecutive system/user messages and the assistant header that follows them form
one `instruction` block; an assistant message's content plus EOS is a `response` block,
so blocks alternate and always start with an instruction. Each block is tokenised on its
own, which makes block boundaries exact (a BPE merge never spans two blocks); the ids can
differ from tokenising the whole rendered text at the seams, and a prompt for generation
must be built the same way: a conversation ending in a user turn renders its last
instruction block with the assistant header, ready for the model to answer.

Labels, next-token convention of the contract: labels[t] = input_ids[t + 1] if token t + 1
is a response token, else -100; the last token of a sample gets -100. So exactly the
assistant content tokens and the EOS ending each response are predicted (SkipAlign Eq. 1),
the first of them from the last token of the assistant header.
Samples longer than `max_sample_length` (4096 in the paper, §4) are cut there; a sample
left without a response token is dropped and counted.

Variants (`SFTRows`), rows of `window` tokens; a pad token has label -100 and belongs to
its own trailing document (positions 0, 1, ...), so it never attends to a real token:

- `normal` (Normal-SFT): one sample per row, ids 0..n-1; with `pack=True` whole samples
  are laid into rows greedily in a seeded order, one document each (document mask, ids
  reset per document).
- `packed` (PackedSFT-k, LongChat): all samples concatenated in a seeded order and cut into
  rows of k = window tokens; one document per row (samples attend across each other), ids
  0..k-1. A sample cut by a row boundary goes on in the next row; the last token of a row
  is labelled with the first token of the next one when that is a response token, so every
  response token of every sample is predicted exactly once.
- `skipalign`: like `normal` (one sample per row, or `pack=True`), with the ids of
  `positions.skipalign_position_ids` (strategy all | inner | outer, extended length L,
  probability p, p_scope), drawn from `np.random.default_rng([seed, 1, sample index])`:
  a sample's ids do not depend on the packing or on the other samples. They are drawn
  once, as the paper's pre-processing does (§4): every epoch sees the same skips.

`pack` applies to normal and skipalign; PackedSFT-k rows are always full. Measured on the
embedded set (4,000 samples, 1.12M tokens, 58.9M response-query pairs), share of pairs at
relative distance >= 1024: normal and packed(k=1024) 0; skipalign L = 100K, p = 0.5:
outer 57% (30% >= 50K; 92% of samples skip at least once), all 72%, outer with
p_scope=sample 36%. The extended range is U-shaped rather than flat (per 10K bin: 3.2M
at 10-20K, 2.4M at 50-60K, 6.6M at 90-100K): these samples have 3-8 outer boundaries and
the skips add up towards L - |m|, while the paper's Tulu V2 samples mostly have one or two.

Embedded dataset (`embedded_conversations`): deterministic multi-turn conversations in
which the user states synthetic facts ("The code of the blue door is 4821.", "Alice lives
in Oslo.") and asks for some of them turns later, with filler tasks (arithmetic, sorting,
reversing words, ...) in between and distractor facts of the same kind; the last turn
always asks for an earlier fact. Answers thus depend on turns that skipped positions move
far away. Conversation i is drawn from `np.random.default_rng([seed, i])`, so a larger
set extends a smaller one. The default 4,000 conversations have 3-8 user turns and
123-500 bpe-8192 tokens (median 280, 99th percentile 449): they fit windows of 512 and up.
Generating them takes ~1 s and tokenising ~3-4 s on 2 CPU cores (~50 us per block encode).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from longctx.errors import DataError
from longctx.batch import IGNORE_INDEX
from longctx.data.positions import INSTRUCTION, P_SCOPES, RESPONSE, STRATEGIES, skipalign_position_ids
from longctx.data.tokenizer import Tokenizer
from longctx.probes.position_frequency import Histogram, relative_position_counts

log = logging.getLogger(__name__)

CHAT_ROLES = ("system", "user", "assistant")
VARIANTS = ("normal", "packed", "skipalign")
ON_BAD_SAMPLE = ("skip", "error")
EMBEDDED = "embedded"
EMBEDDED_SAMPLES = 4000
ASSISTANT_HEADER = "<|assistant|>\n"
_ORDER_STREAM, _POSITION_STREAM = 0, 1
"""Second seed word of the two random streams of SFTRows (sample order, SkipAlign ids)."""


class SFTDataError(DataError):
    """An SFT source cannot be read or yields no usable sample."""


@dataclass
class SFTReport:
    """What loading an SFT source kept and dropped."""

    source: str
    """The path read, or a description of the embedded set."""
    conversations: int = 0
    """Well-formed conversations read."""
    bad: list[tuple[int, str]] = field(default_factory=list)
    """(1-based line number, reason) of every malformed line skipped."""
    truncated: int = 0
    """Samples cut to max_sample_length tokens."""
    without_labels: int = 0
    """Samples dropped because no response token was left after truncation."""
    samples: int = 0
    """Samples kept."""

    def summary(self) -> str:
        return (
            f"{self.source}: {self.samples} samples from {self.conversations} conversations; "
            f"{len(self.bad)} malformed lines skipped, {self.truncated} truncated, "
            f"{self.without_labels} dropped without a response token"
        )


# --- reading --------------------------------------------------------------------------


def conversation_problem(record: object) -> str | None:
    """Why a decoded JSONL record is not a usable conversation, or None if it is one."""
    if not isinstance(record, dict) or not isinstance(record.get("messages"), list):
        return "expected an object with a 'messages' list"
    for index, message in enumerate(record["messages"]):
        if not isinstance(message, dict):
            return f"messages[{index}] is not an object"
        role, content = message.get("role"), message.get("content")
        if role not in CHAT_ROLES:
            return f"messages[{index}] has unknown role {role!r} (expected one of {CHAT_ROLES})"
        if not isinstance(content, str) or not content.strip():
            return f"messages[{index}] ({role}) has empty content"
    if not any(message["role"] == "assistant" for message in record["messages"]):
        return "no assistant turn"
    return None


def read_conversations(path: str | Path, on_bad_sample: str, report: SFTReport) -> list[list[dict]]:
    """The message lists of a Tulu-v2 JSONL file; malformed lines go to `report.bad` or raise."""
    if on_bad_sample not in ON_BAD_SAMPLE:
        raise ValueError(f"on_bad_sample must be one of {ON_BAD_SAMPLE}, got {on_bad_sample!r}")
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"SFT data {str(path)!r} is not a file (give a JSONL path or {EMBEDDED!r})")
    conversations = []
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                problem = f"bad JSON ({err.msg} at column {err.colno})"
            else:
                problem = conversation_problem(record)
            if problem is None:
                conversations.append(record["messages"])
            elif on_bad_sample == "error":
                raise SFTDataError(f"{path}:{number}: {problem} (set on_bad_sample=skip to skip such lines)")
            else:
                report.bad.append((number, problem))
    report.conversations = len(conversations)
    return conversations


# --- template and tokenisation --------------------------------------------------------


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


# --- rows of the three variants -------------------------------------------------------


class SFTRows(torch.utils.data.Dataset):
    """Contract rows of `window` tokens of one SFT variant (see the module docstring).

    Map-style: item i is a dict of [window] tensors (input_ids, labels, position_ids,
    document_ids); a DataLoader stacks them into [B, window] and may shuffle them.
    `position_limit` bounds every position id from above (exclusive): the longest sample
    for normal, window for packed, extended_length for skipalign; the model's RoPE range
    (`model.max_position`) must reach it.
    """

    def __init__(
        self,
        samples: Sequence[ChatSample],
        *,
        variant: str,
        window: int,
        pad_id: int,
        seed: int = 0,
        pack: bool = False,
        strategy: str = "outer",
        extended_length: int = 100_000,
        p: float = 0.5,
        p_scope: str = "boundary",
    ):
        if variant not in VARIANTS:
            raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(f"window must be a positive int, got {window!r}")
        if not samples:
            raise ValueError("samples is empty")
        if variant == "skipalign":
            if strategy not in STRATEGIES:
                raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
            if p_scope not in P_SCOPES:
                raise ValueError(f"p_scope must be one of {P_SCOPES}, got {p_scope!r}")
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"p must be a probability in [0, 1], got {p!r}")
        self.samples, self.variant, self.window, self.pad_id, self.seed = samples, variant, window, pad_id, seed
        self.strategy, self.extended_length, self.p, self.p_scope = strategy, extended_length, p, p_scope
        order = np.random.default_rng([seed, _ORDER_STREAM]).permutation(len(samples))
        longest = max(len(sample) for sample in samples)
        if variant == "packed":
            self._stream = np.concatenate([samples[i].input_ids for i in order])
            self._stream_labels = np.concatenate([samples[i].labels for i in order])
            self.position_limit = window
            return
        if longest > window:
            index = max(range(len(samples)), key=lambda i: len(samples[i]))
            raise ValueError(
                f"sample {index} has {longest} tokens but window is {window}: "
                f"set max_sample_length <= window for the {variant} variant"
            )
        if variant == "skipalign" and longest > extended_length:
            raise ValueError(f"extended_length={extended_length} is shorter than the longest sample ({longest} tokens)")
        if pack:
            self._plan = _next_fit([len(samples[i]) for i in order], order, window)
        else:
            self._plan = [[i] for i in range(len(samples))]
        self.position_limit = extended_length if variant == "skipalign" else longest

    def __len__(self) -> int:
        if self.variant == "packed":
            return math.ceil(len(self._stream) / self.window)
        return len(self._plan)

    def position_ids(self, sample_index: int) -> np.ndarray:
        """int64 [n]: the ids sample `sample_index` is trained with (normal and skipalign)."""
        sample = self.samples[sample_index]
        if self.variant == "normal":
            return np.arange(len(sample), dtype=np.int64)
        rng = np.random.default_rng([self.seed, _POSITION_STREAM, sample_index])
        return skipalign_position_ids(
            sample.block_lengths, sample.roles, self.extended_length, self.strategy, self.p, rng, self.p_scope
        )

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if not 0 <= index < len(self):
            raise IndexError(f"row {index} is outside the {len(self)} rows")
        row = {
            "input_ids": np.full(self.window, self.pad_id, dtype=np.int64),
            "labels": np.full(self.window, IGNORE_INDEX, dtype=np.int64),
            "position_ids": np.zeros(self.window, dtype=np.int64),
            "document_ids": np.zeros(self.window, dtype=np.int64),
        }
        if self.variant == "packed":
            start = index * self.window
            used = min(self.window, len(self._stream) - start)
            row["input_ids"][:used] = self._stream[start : start + used]
            row["labels"][:used] = self._stream_labels[start : start + used]
            row["position_ids"][:used] = np.arange(used)
            documents = 1
        else:
            used = 0
            for document, sample_index in enumerate(self._plan[index]):
                sample = self.samples[sample_index]
                span = slice(used, used + len(sample))
                row["input_ids"][span] = sample.input_ids
                row["labels"][span] = sample.labels
                row["position_ids"][span] = self.position_ids(sample_index)
                row["document_ids"][span] = document
                used += len(sample)
            documents = len(self._plan[index])
        row["position_ids"][used:] = np.arange(self.window - used)
        row["document_ids"][used:] = documents
        return {key: torch.from_numpy(value) for key, value in row.items()}


def _next_fit(lengths: Sequence[int], order: Sequence[int], window: int) -> list[list[int]]:
    """Sample indices `order` (of these lengths) laid into rows of `window` tokens in order."""
    rows, room = [], 0
    for length, index in zip(lengths, order):
        if length > room:
            rows.append([])
            room = window
        rows[-1].append(int(index))
        room -= length
    return rows


def relative_distance_histogram(
    rows: Iterable[Mapping[str, torch.Tensor]], max_distance: int, rows_per_call: int = 256
) -> Histogram:
    """f(d) of response queries summed over contract rows ([T] or [B, T] dicts): SkipAlign Figure 2.

    Pairs at d >= max_distance are counted in `overflow`. An `SFTRows` can be passed as it
    is: its [T] rows are stacked `rows_per_call` at a time, since a counter call has a fixed
    cost of ~20 ms at max_distance = 100K (1,000 SkipAlign rows of 512 tokens on 2 CPU
    cores: 0.9 s stacked 256 at a time, 25 s one by one).
    """
    counts, overflow = torch.zeros(max_distance, dtype=torch.long), torch.zeros((), dtype=torch.long)
    for batch in _batches(rows, rows_per_call):
        histogram = relative_position_counts(
            batch["position_ids"], batch["document_ids"], max_distance, batch["labels"]
        )
        counts += histogram.counts
        overflow += histogram.overflow
    return Histogram(counts, overflow)


def _batches(rows: Iterable[Mapping[str, torch.Tensor]], size: int) -> Iterable[dict[str, torch.Tensor]]:
    """[B, T] dicts of the keys f(d) reads: [B, T] rows as they are, [T] rows stacked `size` at a time."""
    keys, pending = ("position_ids", "document_ids", "labels"), []
    for row in rows:
        if row["position_ids"].dim() == 2:
            yield {key: row[key] for key in keys}
            continue
        if pending and pending[-1]["position_ids"].shape != row["position_ids"].shape:
            yield {key: torch.stack([r[key] for r in pending]) for key in keys}
            pending = []
        pending.append(row)
        if len(pending) == size:
            yield {key: torch.stack([r[key] for r in pending]) for key in keys}
            pending = []
    if pending:
        yield {key: torch.stack([r[key] for r in pending]) for key in keys}


# --- embedded dataset -----------------------------------------------------------------

_COLORS = ("blue", "red", "green", "yellow", "black", "white", "silver", "golden", "purple", "orange", "grey", "brown")
_OBJECTS = ("door", "gate", "box", "safe", "locker", "chest", "cabinet", "vault", "drawer", "suitcase")
_NAMES = (
    "Alice", "Bruno", "Clara", "Daniel", "Elena", "Farid", "Greta", "Hugo", "Irene", "Jonas",
    "Kira", "Liam", "Mona", "Nadia", "Oscar", "Paula", "Quinn", "Rosa", "Samir", "Tara",
)  # fmt: skip
_CITIES = (
    "Lisbon", "Oslo", "Cairo", "Lima", "Quito", "Dublin", "Prague", "Nairobi",
    "Hanoi", "Perth", "Tallinn", "Bogota", "Seoul", "Vienna", "Accra", "Riga",
)  # fmt: skip
_PETS = ("cat", "dog", "parrot", "horse", "turtle", "rabbit", "goat", "owl")
_WORDS = (
    "apple", "river", "stone", "cloud", "garden", "window", "candle", "forest", "bridge", "pepper",
    "mirror", "castle", "rocket", "violin", "pencil", "island", "dragon", "butter", "planet", "ladder",
    "tiger", "lemon", "anchor", "button", "meadow", "silver", "thunder", "harbor", "orchid", "marble",
)  # fmt: skip
_DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
_SYSTEM = "You are a helpful assistant. Remember what the user tells you and answer from it."
_INTROS = ("Please remember these facts.", "Here is some information for later.", "Keep these details in mind.")
_ACKS = ("Understood, I will remember that.", "Got it.", "Noted, I will keep it in mind.")


def embedded_conversations(num_samples: int = EMBEDDED_SAMPLES, seed: int = 0) -> list[list[dict[str, str]]]:
    """The embedded multi-turn SFT set: `num_samples` Tulu-style message lists (module docstring)."""
    if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
        raise ValueError(f"num_samples must be a positive int, got {num_samples!r}")
    return [_conversation(np.random.default_rng([seed, index])) for index in range(num_samples)]


def _pick(rng: np.random.Generator, options: Sequence[str]) -> str:
    return options[int(rng.integers(len(options)))]


def _facts(rng: np.random.Generator, count: int) -> list[tuple[str, str, str]]:
    """`count` (statement, question, answer) facts about distinct keys."""
    facts, keys = [], set()
    while len(facts) < count:
        kind = int(rng.integers(3))
        if kind == 0:
            color, thing, code = _pick(rng, _COLORS), _pick(rng, _OBJECTS), int(rng.integers(1000, 10000))
            key, statement = ("code", color, thing), f"The code of the {color} {thing} is {code}."
            question = f"What is the code of the {color} {thing}?"
        elif kind == 1:
            name, city = _pick(rng, _NAMES), _pick(rng, _CITIES)
            key, statement, question = ("city", name), f"{name} lives in {city}.", f"Where does {name} live?"
        else:
            name, pet, age = _pick(rng, _NAMES), _pick(rng, _PETS), int(rng.integers(2, 20))
            key, statement = ("age", name, pet), f"{name}'s {pet} is {age} years old."
            question = f"How old is {name}'s {pet}?"
        if key not in keys:
            keys.add(key)
            facts.append((statement, question, statement))
    return facts


def _filler(rng: np.random.Generator) -> tuple[str, str]:
    """A self-contained (question, answer) task."""
    task = int(rng.integers(6))
    if task == 0:
        a, b = (int(x) for x in rng.integers(10, 100, size=2))
        return f"What is {a} plus {b}?", f"{a} plus {b} is {a + b}."
    if task == 1:
        numbers = [int(x) for x in rng.choice(100, size=int(rng.integers(3, 8)), replace=False)]
        listed = ", ".join(map(str, numbers))
        return f"Sort these numbers from smallest to largest: {listed}.", ", ".join(map(str, sorted(numbers))) + "."
    words = [str(w) for w in rng.choice(_WORDS, size=int(rng.integers(3, 8)), replace=False)]
    if task == 2:
        return f"Write these words in reverse order: {' '.join(words)}.", " ".join(reversed(words)) + "."
    if task == 3:
        return f'How many letters are in the word "{words[0]}"?', f'The word "{words[0]}" has {len(words[0])} letters.'
    if task == 4:
        day = int(rng.integers(7))
        return f"Which day comes after {_DAYS[day]}?", f"{_DAYS[(day + 1) % 7]} comes after {_DAYS[day]}."
    return f"Rewrite in capital letters: {' '.join(words)}.", " ".join(words).upper() + "."


def _conversation(rng: np.random.Generator) -> list[dict[str, str]]:
    facts = _facts(rng, int(rng.integers(3, 7)))
    told = int(rng.integers(2, min(4, len(facts)) + 1))
    messages = [{"role": "system", "content": _SYSTEM}] if rng.random() < 0.3 else []
    intro = " ".join([_pick(rng, _INTROS), *(statement for statement, _, _ in facts[:told])])
    messages += [{"role": "user", "content": intro}, {"role": "assistant", "content": _pick(rng, _ACKS)}]
    unasked = list(range(told))
    turns = int(rng.integers(2, 8))
    for turn in range(turns):
        roll = rng.random()
        if turn == turns - 1 or (roll < 0.3 and unasked):
            pool = unasked if unasked else list(range(told))
            fact = pool.pop(int(rng.integers(len(pool))))
            question, answer = facts[fact][1], facts[fact][2]
        elif roll < 0.45 and told < len(facts):
            question, answer = f"One more thing: {facts[told][0]}", _pick(rng, _ACKS)
            unasked.append(told)
            told += 1
        else:
            question, answer = _filler(rng)
        messages += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
    return messages
