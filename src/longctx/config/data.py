"""The `data` section: what the model trains on, how rows are packed, and the position
transforms of context extension (docs/design.md §3, §11). Imports no torch.

Each section checks its own fields in `validate()`, called when it is built; the entries of
`data.mixture` are checked by `DataConfig.validate`, which knows their index. Checks against
the model (the window, the target length) are `ExperimentConfig.validate`'s.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from longctx.config.checks import above, choice, positive_int
from longctx.errors import ConfigError

TEMPLATES = ("inventory", "niah", "repeat")
"""Wordings of a retrieval document (data/retrieval.py)."""
NIAH_DIGITS = (6, 7)
"""Needle lengths of the NIAH tasks (6: STRING's, 7: RULER's), never drawn for training."""


@dataclass
class RetrievalConfig:
    """Generated key->value retrieval documents (data/retrieval.py, docs/design.md §13)."""

    documents: int = 20_000
    """Documents generated (one epoch of this source)."""
    facts: int = 4
    """Key->value facts stated per document."""
    queries: int = 4
    """Facts asked back one by one at the document's end (<= facts)."""
    list_query: bool = True
    """End with one question asking for all values in order (the shape of STRING's NIAH)."""
    filler_min: int = 0
    """Fewest filler sentences per document."""
    filler_max: int = 40
    """Most filler sentences per document; the count is log-uniform in [min, max] (filler_tail 0)."""
    filler_tail: float = 0.0
    """> 0: the filler count n follows a truncated power law instead, n + 1 Pareto with
    exponent alpha = filler_tail on [filler_min + 1, filler_max + 1]: P(n + 1 > x) falls as
    x^-alpha, so most documents are short and long needle-question distances rare, as in
    real corpora (STRING §2.2, Fig. 1). 0 = log-uniform (the alpha -> 0 limit), the default, so configs
    without the key keep their documents."""
    value_digits: int = 5
    """Digits of a value; NIAH uses 6 and 7, so keep it outside {6, 7}."""
    value_digits_max: int = 0
    """> 0: each value draws its digit count uniformly from [value_digits, value_digits_max]
    minus {6, 7}, so a model learns to copy a number to its end, not a fixed count of digits
    (the `niah` template trains on 4-5 and 8-9 digits and is tested on 6). 0 = value_digits."""
    template: str = "inventory"
    """inventory: keyed facts in wording disjoint from every NIAH task, asked back one by one
    and as a list. niah: STRING's NIAH wording (needle " One of the magic numbers is N.",
    its question and answer prefix) over this source's filler and values, `facts` needles,
    only the list question (queries must be 0); see docs/replication_log.md (2026-11-23) for why.
    repeat: `facts` numbers in a row, then the same numbers again (no filler, no question):
    every digit of the second half can be copied, the dense signal on which a copying
    (induction) circuit forms; queries must be 0. The held-out answer probe leaves it out
    (its loss is not the NIAH answers')."""
    seed: int = 0
    """Generator seed; document k uses numpy's generator seeded with [seed, k]."""

    def validate(self, key: str = "data.mixture.retrieval") -> None:
        """`key` is the entry's place in the mixture (`data.mixture.0.retrieval`)."""
        for name in ("documents", "facts", "value_digits"):
            positive_int(f"{key}.{name}", getattr(self, name))
        if not 0 <= self.queries <= self.facts:
            raise ConfigError(f"{key}.queries", f"must be in [0, facts={self.facts}], got {self.queries}")
        if not 0 <= self.filler_min <= self.filler_max:
            raise ConfigError(
                f"{key}.filler_max", f"need 0 <= filler_min <= filler_max, got {self.filler_min} and {self.filler_max}"
            )
        if not isinstance(self.filler_tail, (int, float)) or self.filler_tail < 0:
            raise ConfigError(f"{key}.filler_tail", f"must be >= 0 (0 = log-uniform), got {self.filler_tail!r}")
        if self.value_digits in NIAH_DIGITS:
            raise ConfigError(
                f"{key}.value_digits",
                f"{self.value_digits} is a NIAH needle length (6: STRING, 7: RULER); "
                "training on it would leak the evaluation's number format",
            )
        if self.value_digits_max and self.value_digits_max < self.value_digits:
            raise ConfigError(
                f"{key}.value_digits_max",
                f"must be 0 or >= value_digits={self.value_digits}, got {self.value_digits_max}",
            )
        if self.template not in TEMPLATES:
            raise ConfigError(f"{key}.template", f"must be one of {', '.join(TEMPLATES)}, got {self.template!r}")
        if self.template in ("niah", "repeat") and (self.queries or not self.list_query):
            raise ConfigError(
                f"{key}.queries",
                f"template {self.template} asks only for the list of values: set queries: 0 and list_query: true",
            )
        if self.queries == 0 and not self.list_query:
            raise ConfigError(
                f"{key}.queries", "0 with list_query=false asks nothing; the source would teach no retrieval"
            )


@dataclass
class DataSource:
    """One dataset in a weighted mixture: prepared by `longctx prepare`, or generated."""

    path: str = ""
    """kind=prepared: a directory written by `longctx prepare` (local or s3://...).
    kind=retrieval: where to write the generated dataset; '' = a cache directory keyed by
    the `retrieval` settings and the tokenizer."""
    weight: float = 1.0
    """Share of rows drawn from this source (normalised over the mixture)."""
    kind: str = "prepared"
    """prepared | retrieval (generated key->value documents, data/retrieval.py, docs/design.md §13)."""
    retrieval: RetrievalConfig = field(default_factory=RetrievalConfig)
    """kind=retrieval: how the documents are generated (ignored otherwise)."""

    def validate(self, key: str) -> None:
        """`key` is the entry's place in the mixture (`data.mixture.0`)."""
        choice(f"{key}.kind", self.kind, ("prepared", "retrieval"))
        if self.kind == "retrieval":
            self.retrieval.validate(f"{key}.retrieval")
        elif not self.path:
            raise ConfigError(f"{key}.path", "is empty")
        above(f"{key}.weight", self.weight, 0)


@dataclass
class PoseConfig:
    """PoSE (Zhu et al. 2023 §3.2): chunked position skipping (data/positions.py)."""

    chunks: int = 2
    """N: chunks per document, each with its own skipping bias (documents shorter than N
    tokens use one chunk per token)."""
    compat: str = "paper"
    """paper (chunk lengths a uniform random composition) | repo (the authors' code:
    chunk 0 ~ U{1, ceil(n/2)}; needs chunks=2). Content skipping is not applied."""


@dataclass
class LongRecipeConfig:
    """LongRecipe position index transformation (§4.2, Algorithm 1; data/positions.py)."""

    compat: str = "paper"
    """paper (Algorithm 1 on the trained tokens) | repo (the authors' preprocessing: a
    contiguous head of U{1, (n+1)/2} tokens, the rest on the sentence canvas)."""
    delimiters: str = ".!?\n"
    """A token whose text holds any of these characters ends a sentence."""


@dataclass
class DataConfig:
    """What the model trains on and how rows are packed (docs/design.md §3, §11)."""

    path: str = ""
    """A directory written by `longctx prepare`, or '' for the embedded corpus (prepared on first use)."""
    mixture: list[DataSource] = field(default_factory=list)
    """Weighted sources (ProLong-style long/short mix); when set, `path` must be ''."""
    tokenizer: str = "bpe-8192"
    """bpe-8192 (trained on the embedded corpus) | llama3 | cl100k | a tokenizer.json path."""
    window: int = 0
    """Tokens per packed row: the training context length L. 0 = model.max_position."""
    doc_mask: bool = True
    """True: positions reset and attention confined per document. False: plain causal row."""
    packing: str = "stream"
    """stream: rows are consecutive blocks of the shuffled token stream, documents cut at row
    boundaries (STRING, TinyLlama). documents: whole documents per row, the rest padded;
    longer ones split into rows of their own (data/packing.py)."""
    long_documents: str = "split"
    """packing=documents: a document longer than a row is split into rows of its own
    (split) or left out (drop)."""
    mask_cut_answers: bool = True
    """Retrieval sources: an answer whose fact lies before its row (a row edge cut the
    document between them) gets label -100 instead of a target it cannot see
    (data/answer_spans.py); each run counts them in <out_dir>/answer_masking.json."""
    verify: str = "sizes"
    """Integrity check of prepared datasets when training opens them (data/integrity.py):
    sizes (every local chunk's size against the manifest: one stat each) | full (also
    every chunk's SHA-256: reads the whole dataset once, and downloads remote ones)."""
    seed: int = 1234
    """Shuffling, packing and position-transform seed."""
    long_share: float = 0.0
    """ProLong-style long/short mix: 0 = the data.mixture weights as written; in (0, 1) the
    mixture must list two sources, [long, short], and the first gets this share of rows
    (ProLong: 0.6)."""
    position_transform: str = "none"
    """Context extension by position ids (data/transforms.py): none | pose | randpos |
    longrecipe. Rows of `window` tokens get ids spread over [0, target_length)."""
    target_length: int = 0
    """L_t, the extended window the transformed ids reach; 0 = model.max_position."""
    pose: PoseConfig = field(default_factory=PoseConfig)
    """position_transform=pose parameters."""
    longrecipe: LongRecipeConfig = field(default_factory=LongRecipeConfig)
    """position_transform=longrecipe parameters."""

    def source_weights(self) -> list[float]:
        """Row share of each data.mixture source (long_share applied)."""
        if self.long_share:
            return [self.long_share, 1.0 - self.long_share]
        return [source.weight for source in self.mixture]

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """The section's own fields; window and target_length may still be 0 (= the model's)."""
        for key in ("window", "target_length"):
            if getattr(self, key):
                positive_int(f"data.{key}", getattr(self, key))
        if self.mixture and self.path:
            raise ConfigError("data.path", "set either data.path or data.mixture, not both", ("data.mixture",))
        for i, source in enumerate(self.mixture):
            source.validate(f"data.mixture.{i}")
        choice("data.packing", self.packing, ("stream", "documents"))
        choice("data.verify", self.verify, ("sizes", "full"))
        choice("data.long_documents", self.long_documents, ("split", "drop"))
        choice("data.position_transform", self.position_transform, ("none", "pose", "randpos", "longrecipe"))
        positive_int("data.pose.chunks", self.pose.chunks)
        choice("data.pose.compat", self.pose.compat, ("paper", "repo"))
        if self.pose.compat == "repo" and self.pose.chunks != 2:
            raise ConfigError(
                "data.pose.chunks",
                f"compat=repo is the authors' two-chunk code, got {self.pose.chunks}",
                ("data.pose.compat",),
            )
        choice("data.longrecipe.compat", self.longrecipe.compat, ("paper", "repo"))
        if not self.longrecipe.delimiters:
            raise ConfigError("data.longrecipe.delimiters", "is empty: at least one character must end a sentence")
        if self.long_share:
            if not 0 < self.long_share < 1:
                raise ConfigError("data.long_share", f"must be in (0, 1) or 0 (off), got {self.long_share}")
            if len(self.mixture) != 2:
                raise ConfigError(
                    "data.long_share",
                    f"needs data.mixture = [long, short], got {len(self.mixture)} sources",
                    ("data.mixture",),
                )

    def validate_for_model(self, max_position: int) -> None:
        """Checks against the model's context, once window and target_length are resolved."""
        if self.window > max_position:
            raise ConfigError(
                "data.window",
                f"{self.window} exceeds model.max_position={max_position}; raise model.max_position "
                "(the context the model is configured for) or shorten the window",
                ("model.max_position",),
            )
        if self.position_transform != "none":  # target_length matters only to a transform
            if self.target_length < self.window:
                raise ConfigError(
                    "data.target_length",
                    f"{self.target_length} is shorter than data.window={self.window}: the transformed ids of a "
                    "window-token row must fit below the target length",
                    ("data.window",),
                )
            if self.target_length > max_position:
                raise ConfigError(
                    "data.target_length",
                    f"{self.target_length} exceeds model.max_position={max_position}: set model.max_position "
                    "to the extended window",
                    ("model.max_position",),
                )
        if self.pose.chunks > self.window:
            raise ConfigError("data.pose.chunks", f"{self.pose.chunks} chunks do not fit a {self.window}-token row")
