"""Effective context length by the 4-needle NIAH test (STRING §3 "Evaluation", Figure 4; docs/design.md §7.2).

This module owns the search and its report. For lengths L = step, 2 step, ... <= max_length
(step 128 in the paper) it builds `tests_per_length` prompts of exactly L tokens
(`longctx.niah.tasks`), decodes greedily, counts a test as passed when >= `min_found`
answers (2 of 4 needles) appear in the output, and stops after the first length whose
pass rate is below `pass_threshold` (0.5). The effective length is the last length before
it (0 when the first length fails; the largest tested length when none fails). Lengths
too short for the prompt's fixed part are skipped and listed (`skipped_lengths`): with
bpe-8192, which spells a 6-digit number in 6 tokens, `paper` needs 125 tokens,
`string-repo` 129 (so it starts at 256 with the paper's step of 128), the RULER tasks
172-215 and `helmet-json-kv` 135.

Each pass rate p = k / n comes with the Wilson score 95% interval (z = 1.96):

    centre = (p + z^2 / 2n) / (1 + z^2 / n)
    half   = z / (1 + z^2 / n) * sqrt(p (1 - p) / n + z^2 / 4n^2)

(at the paper's n = 500 a rate of 0.5 is known to +-0.044; at n = 50, +-0.13).

Every answer's needle depth (its position as a fraction of the haystack) falls into one
of `depth_bands` equal bands; recall per band and per (band, length) cell is the depth x
length heatmap of Figure 4 (`plot_heatmap`), recall per band over all lengths the depth
profile of Table 4.

The model is anything with `generate(input_ids [B, T], max_new_tokens) -> [B, new]`
(`Generator`), so tests can pass in oracles. `LlamaGenerator` runs `greedy_generate`:
one prefill of a batch of prompts of the same length, then one cached token per step, so
a new token costs one token's forward (attending to L cached keys) instead of re-running
all L + t tokens (an order of magnitude faster than recompute at the lengths the tests
use; `benchmarks/niah.py`, docs/benchmarks.md). Every test decodes `max_new_tokens` tokens; the
output is cut at the first EOS before scoring.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np
import torch
from tqdm import tqdm

from longctx.config import NiahConfig
from longctx.errors import ConfigError
from longctx.model.generation import greedy_generate
from longctx.model.llama import Llama
from longctx.model.position_methods import PositionMethod
from longctx.niah.chat import prompt_frame
from longctx.niah.haystack import Haystack, TextTokenizer
from longctx.niah.needles import PromptTooShortError, get_task
from longctx.niah.tasks import found_answers, make_samples

WILSON_Z = 1.96


class Generator(Protocol):
    def generate(self, input_ids: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
        """input_ids [B, T] int64 -> new token ids [B, <= max_new_tokens]."""
        ...


@dataclass
class LlamaGenerator:
    """Greedy KV-cache decoding of a `Llama`, several prompts per forward.

    A batch holds max(1, min(batch_size, batch_tokens // L)) prompts of length L: the
    prefill returns [B, L, vocab] fp32 logits (B L x 32 KiB for an 8192 vocabulary, 256 MiB
    at the default 8192 tokens), and a decoding step is dominated by per-op overhead (32
    rows cost 1.6x 8 rows on `tiny` at L = 1024, one CPU thread), so short prompts go in
    large batches.
    """

    model: Llama
    batch_size: int = 64
    """Most prompts per forward."""
    batch_tokens: int = 8192
    """Most prompt tokens per forward (B x L)."""
    attention_backend: str | None = None
    """None = the model's configured backend. On CPU `sdpa` prefills single-document
    prompts faster than `varlen`, the training default (benchmarks/niah.py)."""
    position_method: PositionMethod | None = None
    """StRing or a baseline (`build_position_method`); None = the model's plain RoPE."""
    prefill_chunk_tokens: int = 0
    """Prompt tokens per row per prefill forward (0 = the whole prompt; model/generation.py)."""

    def __post_init__(self) -> None:
        for name in ("batch_size", "batch_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")

    def rows_per_batch(self, length: int) -> int:
        return max(1, min(self.batch_size, self.batch_tokens // length))

    def generate(self, input_ids: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
        device = self.model.tok_embeddings.weight.device
        outputs = [
            greedy_generate(
                self.model,
                chunk.to(device),
                max_new_tokens,
                attention_backend=self.attention_backend,
                position_method=self.position_method,
                prefill_chunk_tokens=self.prefill_chunk_tokens,
            )
            for chunk in input_ids.split(self.rows_per_batch(input_ids.shape[1]))
        ]
        return torch.cat(outputs).cpu()


@dataclass
class LengthResult:
    length: int
    tests: int
    passed: int
    rate: float
    wilson_low: float
    wilson_high: float
    recall: float
    """Fraction of all answers found (the authors' per-test score, averaged)."""
    example_output: str
    """Decoded output of the first test, for eyeballing."""
    seconds: float = 0.0
    """Wall time of this length: building, decoding and scoring its tests."""


@dataclass
class EffectiveLengthResult:
    effective_length: int
    per_length: list[LengthResult]
    depth_edges: list[float]
    """depth_bands + 1 band edges in [0, 1]."""
    depth_recall: list[float]
    """Recall per depth band over all tested lengths (NaN where no answer fell)."""
    heatmap: np.ndarray
    """[depth_bands, tested lengths] recall (NaN where no answer fell)."""
    skipped_lengths: list[int] = field(default_factory=list)
    """Lengths below the prompt overhead (not tested)."""
    config: NiahConfig = field(default_factory=NiahConfig)

    @property
    def lengths(self) -> list[int]:
        return [row.length for row in self.per_length]

    def to_dict(self) -> dict:
        """Plain lists and numbers (NaN -> None), for JSON and W&B."""

        def clean(values):
            return [None if isinstance(v, float) and math.isnan(v) else v for v in values]

        return {
            "effective_length": self.effective_length,
            "per_length": [dataclasses.asdict(row) for row in self.per_length],
            "depth_edges": self.depth_edges,
            "depth_recall": clean(self.depth_recall),
            "heatmap": [clean(row) for row in self.heatmap.tolist()],
            "lengths": self.lengths,
            "skipped_lengths": self.skipped_lengths,
            "config": dataclasses.asdict(self.config),
        }

    @classmethod
    def from_dict(cls, data: dict) -> EffectiveLengthResult:
        """The inverse of `to_dict` (None -> NaN; derived `lengths` and unknown keys ignored).
        Raises KeyError/TypeError/ValueError on an incomplete dict."""
        fields = {f.name for f in dataclasses.fields(LengthResult)}

        def nan(values):
            return [math.nan if v is None else v for v in values]

        return cls(
            effective_length=int(data["effective_length"]),
            per_length=[LengthResult(**{k: v for k, v in row.items() if k in fields}) for row in data["per_length"]],
            depth_edges=list(data["depth_edges"]),
            depth_recall=nan(data["depth_recall"]),
            heatmap=np.array([nan(row) for row in data["heatmap"]], dtype=float),
            skipped_lengths=list(data.get("skipped_lengths", [])),
            config=_config_from_dict(data["config"]),
        )


def _config_from_dict(values: dict) -> NiahConfig:
    """The settings stored in a niah.json; files written before `lengths` was a setting
    call it `fixed_lengths`."""
    values = dict(values)
    if "fixed_lengths" in values:
        values["lengths"] = list(values.pop("fixed_lengths"))
    known = {f.name for f in dataclasses.fields(NiahConfig)}
    return NiahConfig(**{key: value for key, value in values.items() if key in known})


def check_task_settings(config: NiahConfig) -> None:
    """Raise ConfigError naming the key when the task or its `min_found` is not usable."""
    try:
        task = get_task(config.task)
    except ValueError as error:
        raise ConfigError("eval.niah.task", str(error)) from None
    if config.min_found is not None and not 1 <= config.min_found <= task.num_answers:
        raise ConfigError(
            "eval.niah.min_found", f"must be in [1, {task.num_answers}] for task {task.name!r}, got {config.min_found}"
        )


def wilson_interval(successes: int, trials: int, z: float = WILSON_Z) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion (see the module docstring); (0, 1) for 0 trials."""
    if not 0 <= successes <= trials:
        raise ValueError(f"need 0 <= successes <= trials, got {successes} of {trials}")
    if trials == 0:
        return 0.0, 1.0
    p = successes / trials
    denominator = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denominator
    half = z / denominator * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials))
    return max(0.0, centre - half), min(1.0, centre + half)


def _decode_until_eos(tokenizer: TextTokenizer, ids: list[int], eos_id: int | None) -> str:
    if eos_id is not None and eos_id in ids:
        ids = ids[: ids.index(eos_id)]
    return tokenizer.decode(ids)


def evaluate_length(
    generator: Generator,
    tokenizer: TextTokenizer,
    haystack: Haystack | None,
    length: int,
    config: NiahConfig,
    progress: bool = False,
) -> tuple[LengthResult, np.ndarray, np.ndarray]:
    """One length: its row, plus every answer's depth and whether it was found. With
    `progress`, a bar on stderr counts the tests decoded (one generator call per batch of
    the generator's `rows_per_batch`, when it has one)."""
    start = time.perf_counter()
    task = get_task(config.task)
    min_found = config.min_found or task.min_found
    samples = make_samples(
        tokenizer,
        haystack,
        length,
        config.tests_per_length,
        task=task,
        seed=config.seed,
        snap_to_sentence=config.snap_to_sentence,
        random_start=config.random_start,
        frame=prompt_frame(tokenizer, config.chat_template),
    )
    input_ids = torch.from_numpy(np.stack([s.input_ids for s in samples]))
    eos_id = getattr(tokenizer, "eos_id", None)  # longctx Tokenizers have one; test doubles may not
    rows_per_batch = getattr(generator, "rows_per_batch", None)
    batch = rows_per_batch(length) if rows_per_batch else len(samples)
    outputs: list[str] = []
    with tqdm(total=len(samples), desc=f"NIAH length {length}", unit="test", disable=not progress) as bar:
        for first in range(0, len(samples), batch):
            prompts = input_ids[first : first + batch]
            generated = generator.generate(prompts, config.max_new_tokens)
            if generated.dim() != 2 or generated.shape[0] != len(prompts):
                raise ValueError(f"generator returned shape {tuple(generated.shape)} for {len(prompts)} prompts")
            outputs += [_decode_until_eos(tokenizer, row, eos_id) for row in generated.tolist()]
            bar.update(len(prompts))
    found = [found_answers(s, text) for s, text in zip(samples, outputs, strict=True)]
    passed = sum(sum(f) >= min_found for f in found)
    low, high = wilson_interval(passed, len(samples))
    hits = np.array([hit for f in found for hit in f], dtype=bool)
    depths = np.array([n.depth for s in samples for n in s.answer_needles])
    seconds = time.perf_counter() - start
    row = LengthResult(
        length, len(samples), passed, passed / len(samples), low, high, float(hits.mean()), outputs[0], seconds
    )
    return row, depths, hits


def _band_recall(bands: np.ndarray, hits: np.ndarray, num_bands: int) -> np.ndarray:
    totals = np.bincount(bands, minlength=num_bands)
    found = np.bincount(bands, weights=hits, minlength=num_bands)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(totals > 0, found / totals, np.nan)


def search_effective_length(
    generator: Generator,
    tokenizer: TextTokenizer,
    haystack: Haystack | None,
    config: NiahConfig,
    progress: bool = False,
) -> EffectiveLengthResult:
    """Run the search of the module docstring; `progress`: a bar per length on stderr.
    `config.max_length` must be resolved (`NiahConfig.for_model`) unless `lengths` are given."""
    check_task_settings(config)
    rows: list[LengthResult] = []
    band_columns, all_bands, all_hits, skipped = [], [], [], []
    effective, failed = 0, False
    for length in config.evaluated_lengths():
        try:
            row, depths, hits = evaluate_length(generator, tokenizer, haystack, length, config, progress)
        except PromptTooShortError:
            skipped.append(length)
            continue
        bands = np.minimum((depths * config.depth_bands).astype(np.int64), config.depth_bands - 1)
        rows.append(row)
        band_columns.append(_band_recall(bands, hits, config.depth_bands))
        all_bands.append(bands)
        all_hits.append(hits)
        if row.rate < config.pass_threshold:
            failed = True
            if config.searches:
                break
        elif not failed:
            effective = length
    if not rows:
        raise PromptTooShortError(
            f"every length up to max_length={config.max_length} is below the overhead of task {config.task!r}"
        )
    depth_recall = _band_recall(np.concatenate(all_bands), np.concatenate(all_hits), config.depth_bands)
    return EffectiveLengthResult(
        effective_length=effective,
        per_length=rows,
        depth_edges=np.linspace(0, 1, config.depth_bands + 1).tolist(),
        depth_recall=depth_recall.tolist(),
        heatmap=np.stack(band_columns, axis=1),
        skipped_lengths=skipped,
        config=config,
    )


def plot_heatmap(result: EffectiveLengthResult, path: str | Path, title: str | None = None) -> Path:
    """The depth x length recall grid (STRING Figure 4) as a PNG: depth 0 at the top, red = missed."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    bands = len(result.depth_edges) - 1
    fig = Figure(figsize=(max(4.0, 0.5 * len(result.lengths) + 2), 4.5))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    image = ax.imshow(np.ma.masked_invalid(result.heatmap), cmap="RdYlGn", vmin=0, vmax=1, aspect="auto")
    ax.set_xticks(range(len(result.lengths)), [str(length) for length in result.lengths], rotation=45)
    ax.set_yticks(
        range(bands),
        [f"{100 * a:.0f}-{100 * b:.0f}%" for a, b in zip(result.depth_edges[:-1], result.depth_edges[1:], strict=True)],
    )
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("needle depth")
    ax.set_title(title or f"{result.config.task}: effective length {result.effective_length}")
    fig.colorbar(image, ax=ax, label="needle recall")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path
