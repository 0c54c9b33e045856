"""The `train` and `sft` sections: the optimisation recipe, run control and supervised
fine-tuning (STRING Appendix A.2, SkipAlign §3-4). Imports no torch.

Each section checks its own fields in `validate()`, called when it is built; the check
against the data window is `ExperimentConfig.validate`'s.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from longctx.config.checks import above, at_least, choice, component_spec, positive_int
from longctx.errors import ConfigError

if TYPE_CHECKING:
    from longctx.config.data import DataConfig

LOSS_WEIGHTINGS = ("none", "inverse_frequency")
"""Values of `train.loss_weighting` (train/loss_weights.py)."""
LOSS_KERNELS = ("chunked", "compiled", "liger")
"""Values of `train.loss_kernel` (model/loss.py)."""
LOAD_BALANCERS = ("head_tail", "document")
"""Values of `train.load_balance` (train/context_parallel.py)."""
CONTEXT_PARALLEL_BACKENDS = ("auto", "flex", "sdpa")
"""`model.attention_backend` values that run under train.context_parallel > 1: flex (CUDA;
auto there), sdpa (the dense reference, any device; auto on CPU)."""


@dataclass
class TrainConfig:
    """Optimisation recipe (STRING Appendix A.2 at paper scale) and run control."""

    global_batch_tokens: int = 4_194_304
    """Tokens per optimizer step across all ranks and accumulation steps (4M in the paper)."""
    micro_batch_size: int = 8
    """Rows per forward/backward on one rank."""
    max_steps: int = 100_000
    """Optimizer steps."""
    stop_at_step: int = 0
    """> 0: end the run after this optimizer step, the learning-rate schedule still spanning
    train.max_steps (a tuning job that reads an early probe of the full recipe); 0 = run to
    train.max_steps."""
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
    loss_kernel: str = "chunked"
    """chunked | compiled | liger: how each chunk of train.loss_chunk_tokens (needs > 0
    unless chunked) becomes its summed loss: eager, torch.compile'd (upcast, log-softmax
    and gather fused), or Liger-Kernel's fused linear cross-entropy (CUDA + Triton,
    package liger_kernel; it chunks on its own). Same value up to summation order."""
    loss_weighting: str = "none"
    """none | inverse_frequency: each labelled token's cross-entropy times w(p) = min(cap,
    n_mean / n(p)), p its position id, n(p) the labelled tokens at p over the run's rows
    (counted before step 0, frozen), normalised to mean 1 over the optimizer step
    (train/loss_weights.py). none: the plain mean over labelled tokens."""
    loss_weight_cap: float = 10.0
    """The largest weight inverse_frequency gives a position (>= 1)."""
    loader_workers: int = 0
    """DataLoader worker processes building the packed rows (0 = in the training process).
    Any value yields the same batches in the same order (data/packing.py)."""
    memory_limit_gib: float = 0.0
    """Device memory the run may use, GiB, for the memory check before step 1
    (train/memory_budget.py); 0 = the CUDA device's total memory (no check on CPU)."""
    on_nonfinite: str = "stop"
    """A step whose loss or gradient norm is NaN or infinite has its update dropped on the
    device (train/nonfinite.py); then stop: the run ends at the next logging or checkpoint
    boundary with an error naming the step, and no checkpoint is written after it | skip:
    training goes on, counting dropped steps in train/skipped_steps."""
    max_skipped_steps: int = 10
    """on_nonfinite=skip: more dropped steps than this (over the whole run, resumes
    included) end the run as `stop` does."""
    context_parallel: int = 1
    """Context parallelism: this many ranks share each packed row, each holding 1/N of its
    tokens (input ids, labels, position and document ids) and all-gathering every layer's
    keys/values (train/context_parallel.py, docs/long_sequences.md); 1 = off. Must divide
    the world size; the data-parallel size is world / N. Needs train.strategy=fsdp."""
    load_balance: str = "head_tail"
    """How a row is dealt to the context-parallel ranks, each taking two of 2N chunks:
    head_tail (chunk r and chunk 2N-1-r of the whole row; any packing; balanced for one
    document per row) | document (the same within every document, balanced whatever the
    documents; needs data.packing=documents, which then pads each document to a multiple
    of 2N with unlabelled tokens: data/row_padding.py). train/context_parallel.py."""
    callbacks: list[Any] = field(default_factory=list)
    """Extra Lightning callbacks: [{class_path: pkg.Class, init_args: {...}}, ...] (or bare
    class paths); added after the suite's own (train/loggers.py)."""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        for key in ("global_batch_tokens", "micro_batch_size", "max_steps"):
            positive_int(f"train.{key}", getattr(self, key))
        if not 0 <= self.stop_at_step <= self.max_steps:
            raise ConfigError(
                "train.stop_at_step", f"must be in [0, train.max_steps={self.max_steps}], got {self.stop_at_step}"
            )
        at_least("train.warmup_steps", self.warmup_steps, 0)
        above("train.lr", self.lr, 0)
        if not 0 <= self.min_lr <= self.lr:
            raise ConfigError("train.min_lr", f"must be in [0, train.lr={self.lr}], got {self.min_lr}")
        at_least("train.grad_clip", self.grad_clip, 0)
        choice("train.precision", self.precision, ("auto", "32-true", "bf16-mixed", "bf16-true"))
        choice("train.strategy", self.strategy, ("auto", "ddp", "fsdp"))
        choice("train.schedule", self.schedule, ("cosine", "linear"))
        choice("train.on_nonfinite", self.on_nonfinite, ("stop", "skip"))
        at_least("train.max_skipped_steps", self.max_skipped_steps, 0)
        if not 0 <= self.warmup_ratio < 1:
            raise ConfigError("train.warmup_ratio", f"must be in [0, 1), got {self.warmup_ratio}")
        for key in ("devices", "num_nodes"):
            at_least(f"train.{key}", getattr(self, key), 0)
        positive_int("train.checkpoint_every_steps", self.checkpoint_every_steps)
        at_least("train.loader_workers", self.loader_workers, 0, " (0 = in-process)")
        at_least("train.memory_limit_gib", self.memory_limit_gib, 0, " (0 = the device's)")
        at_least("train.loss_chunk_tokens", self.loss_chunk_tokens, 0, " (0 = off)")
        choice("train.loss_kernel", self.loss_kernel, LOSS_KERNELS)
        if self.loss_kernel != "chunked" and not self.loss_chunk_tokens:
            raise ConfigError(
                "train.loss_kernel",
                f"{self.loss_kernel} is a chunked-loss kernel; set train.loss_chunk_tokens > 0",
                ("train.loss_chunk_tokens",),
            )
        choice("train.loss_weighting", self.loss_weighting, LOSS_WEIGHTINGS)
        if not self.loss_weight_cap >= 1:
            raise ConfigError("train.loss_weight_cap", f"must be >= 1, got {self.loss_weight_cap}")
        if self.loss_weighting != "none" and self.loss_chunk_tokens:
            raise ConfigError(
                "train.loss_weighting",
                f"{self.loss_weighting} needs per-token losses; train.loss_chunk_tokens must be 0",
                ("train.loss_chunk_tokens",),
            )
        positive_int("train.context_parallel", self.context_parallel)
        choice("train.load_balance", self.load_balance, LOAD_BALANCERS)
        if self.context_parallel > 1 and self.strategy != "fsdp":
            raise ConfigError(
                "train.context_parallel",
                f"{self.context_parallel} shards rows over FSDP2's device mesh; set train.strategy=fsdp",
                ("train.strategy",),
            )
        for i, entry in enumerate(self.callbacks):
            class_path, _ = component_spec(entry, f"train.callbacks.{i}")
            if "." not in class_path:
                raise ConfigError(f"train.callbacks.{i}", f"{class_path!r} is not a dotted class path")

    def validate_for_data(self, window: int) -> None:
        """A global batch is a whole number of micro-batches of `window`-token rows."""
        tokens_per_micro_batch = window * self.micro_batch_size
        if self.global_batch_tokens % tokens_per_micro_batch:
            raise ConfigError(
                "train.global_batch_tokens",
                f"{self.global_batch_tokens} is not a multiple of data.window x train.micro_batch_size "
                f"= {window} x {self.micro_batch_size} = {tokens_per_micro_batch}",
                ("data.window", "train.micro_batch_size"),
            )

    def validate_for_context_parallel(self, window: int, backend: str, data: DataConfig) -> None:
        """Under context parallelism a row splits into 2N equal chunks (each rank a head and a
        tail chunk), and attention runs on a backend that takes an explicit query index."""
        size = self.context_parallel
        if size == 1:
            return
        if window % (2 * size):
            raise ConfigError(
                "train.context_parallel",
                f"data.window={window} is not a multiple of 2 x train.context_parallel = {2 * size}",
                ("data.window",),
            )
        if backend not in CONTEXT_PARALLEL_BACKENDS:
            raise ConfigError(
                "model.attention_backend",
                f"{backend!r} does not run under train.context_parallel={size}; use flex (GPU) or sdpa (CPU reference)",
                ("train.context_parallel",),
            )
        if self.load_balance == "document" and (data.packing != "documents" or not data.doc_mask):
            raise ConfigError(
                "train.load_balance",
                "document needs data.packing=documents and data.doc_mask=true (each document padded to a multiple of 2N)",
                ("data.packing", "data.doc_mask"),
            )


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
    """skipalign: L, the largest position id + 1 (100K in the paper; scale down for tiny);
    with rope_extension=ntk, the length RoPE is scaled to for every variant."""
    p: float = 0.5
    """skipalign: probability of a skip (per boundary or per sample, see p_scope)."""
    p_scope: str = "boundary"
    """boundary (a fresh coin per boundary, Eq. 4) | sample (one coin per sample)."""
    epochs: float = 2.0
    """Passes over the rows; sets train.max_steps."""
    rope_extension: str = "none"
    """none | ntk: before SFT, NTK-scale RoPE from the model's max_position to
    max(extended_length, the rows' position limit), whatever the variant (the paper extends
    LLaMA-2 this way; Normal SFT with ntk is SkipAlign's control with the same RoPE)."""
    niah_after: bool = False
    """After SFT, search the NIAH effective length up to `niah_max_length` (SkipAlign
    Figure 3: within and beyond the original window); results in <out_dir>/niah_after_sft/."""
    niah_max_length: int = 0
    """Largest length of that search; 0 = twice the base model's max_position."""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        choice("sft.variant", self.variant, ("normal", "packed", "skipalign"))
        choice("sft.on_bad_sample", self.on_bad_sample, ("skip", "error"))
        choice("sft.strategy", self.strategy, ("all", "inner", "outer"))
        choice("sft.p_scope", self.p_scope, ("boundary", "sample"))
        choice("sft.rope_extension", self.rope_extension, ("none", "ntk"))
        for key in ("embedded_samples", "max_sample_length", "extended_length"):
            positive_int(f"sft.{key}", getattr(self, key))
        if not 0 <= self.p <= 1:
            raise ConfigError("sft.p", f"must be a probability in [0, 1], got {self.p}")
        above("sft.epochs", self.epochs, 0)
