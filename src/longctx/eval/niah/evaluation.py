"""NIAH evaluation of checkpoints: `longctx niah`, the effective-length search.

    longctx niah runs/tiny_1k/checkpoints/last.ckpt eval.niah.tests_per_length=50
    longctx niah CKPT eval.position_method.name=string eval.position_method.string.shift_ratio=0.33

`longctx niah` runs the effective-length search (eval/effective_length.py) with the
`eval.*` settings and writes `<out>/niah.json`, the depth x length heatmap (STRING
Figure 4) as `<out>/niah_heatmap.png` and each length's cell under `<out>/cells/`
(eval/cells.py: a rerun reuses finished lengths, a killed run resumes). Device,
precision, position method and the memory check: eval/model_setup.py. The STRING Table 1 / Table 4 layout (`niah-table`)
runs on the evaluation engine: eval/niah/table.py.
"""

from __future__ import annotations

import contextlib
import json
import math
import tempfile
from pathlib import Path

import torch

from longctx.config import ExperimentConfig, NiahConfig
from longctx.config.position_methods import PositionMethodConfig
from longctx.data.tokenizer import Tokenizer
from longctx.eval import model_setup
from longctx.eval.cells import Cell, Decoding, Progress, check_ranks, run_cell
from longctx.eval.effective_length import EffectiveLengthResult, plot_heatmap, search_effective_length
from longctx.eval.niah.benchmark import SPEC as NIAH
from longctx.eval.niah.engine_task import NiahTask
from longctx.eval.niah.haystack import Haystack
from longctx.eval.niah.needles import TASKS as NEEDLE_TASKS
from longctx.eval.prompt_frame import TextTokenizer
from longctx.eval.ranks import Ranks
from longctx.eval.registry import BenchmarkSpec, owner_of
from longctx.eval.task import Task
from longctx.model.llama import Llama

SEARCH_MODEL = "model"
"""The model's name in the search's cell paths (`<cells>/model/<method>/<task>/L<length>`)."""


def search_settings(
    config: ExperimentConfig, model: Llama, *, tests_per_length: int = 0, max_length: int = 0
) -> NiahConfig:
    """`eval.niah` with max_length resolved for `model`; the in-training probe passes its own
    number of tests, NIAH after SFT its own top length."""
    return config.eval.niah.for_model(
        model.config.max_position, max_length=max_length, tests_per_length=tests_per_length
    )


def evaluation_device(config: ExperimentConfig) -> torch.device:
    """eval.device resolved: auto = cuda when available, else cpu."""
    return model_setup.evaluation_device(config.eval.device)


def other_benchmark(task: str) -> BenchmarkSpec | None:
    """The registered benchmark other than NIAH whose engine task `task` names
    (`ruler-niah_multikey_1`: RULER); None for a NIAH task (or a name no benchmark owns)."""
    owner = None if task in NEEDLE_TASKS else owner_of(task)
    return None if owner is None or owner[0].name == NIAH.name else owner[0]


def load_haystack(config: ExperimentConfig, tokenizer: Tokenizer) -> Haystack | None:
    """The configured haystack, tokenised once; None for tasks that build their own (JSON
    KV, another benchmark's)."""
    needles = NEEDLE_TASKS.get(config.eval.niah.task)
    if (needles is not None and needles.json_haystack) or other_benchmark(config.eval.niah.task):
        return None
    if config.eval.niah.haystack:
        return Haystack.from_file(tokenizer, config.eval.niah.haystack)
    return Haystack.paul_graham(tokenizer)


def search_task(settings: NiahConfig, config: ExperimentConfig, haystack: Haystack | None) -> Task:
    """The engine task the search runs: `<benchmark>-<task>` of another registered benchmark
    (eval/registry.py; `ruler-vt`: RULER's prompts, tokens to generate and scorer, settings
    from eval.benchmarks), else the NIAH task."""
    other = other_benchmark(settings.task)
    if other is None:
        return NiahTask(settings, haystack)
    _, task = settings.task.split("-", 1)
    return other.engine_tasks([task], config, haystack, key="eval.niah.task")[0]


def evaluate(
    model: Llama,
    config: ExperimentConfig,
    tokenizer: TextTokenizer,
    haystack: Haystack | None,
    *,
    method: PositionMethodConfig | None = None,
    settings: NiahConfig | None = None,
    progress: Progress | None = None,
    cells_dir: str | Path | None = None,
    attention_backend: str | None = None,
    ranks: Ranks | None = None,
) -> EffectiveLengthResult:
    """The effective-length search of `model` under a position method (default
    eval.position_method): one engine cell per length under `cells_dir` (None: a temporary
    directory, nothing kept); `progress`: a bar per cell and a line per finished one;
    `attention_backend`: None = the model's configured backend; `ranks` (eval/ranks.py;
    None: this process alone): every rank calls it and each length's batches are spread
    over them, the length decided from all their records before the next starts."""
    method_config = method or config.eval.position_method
    settings = settings or search_settings(config, model)
    task = search_task(settings, config, haystack)
    decoding = Decoding.of(config, settings, attention_backend)
    lengths = settings.evaluated_lengths()
    if lengths:  # the longest length refused before any cell runs
        longest = max(lengths)
        model_setup.check_memory(
            model,
            longest,
            rows=decoding.rows(longest),
            tests=settings.tests_per_length,
            new_tokens=settings.max_new_tokens,
            prefill_chunk_tokens=settings.prefill_chunk_tokens,
            limit_gib=config.eval.memory_limit_gib,
        )
    if ranks is not None and ranks.world > 1:
        if cells_dir is None:
            raise ValueError("a search spread over ranks needs a cells_dir every rank sees")
        check_ranks(cells_dir, {SEARCH_MODEL: model}, ranks)
    with tempfile.TemporaryDirectory() if cells_dir is None else contextlib.nullcontext(str(cells_dir)) as root:

        def run_length(length: int):
            cell = Cell(SEARCH_MODEL, method_config.name, task.name, length)
            return run_cell(
                cell,
                model,
                method_config,
                task,
                tokenizer,
                seed=settings.seed,
                count=settings.tests_per_length,
                root=root,
                decoding=decoding,
                progress=progress,
                ranks=ranks,
            )

        return search_effective_length(run_length, settings)


def write_result(
    result: EffectiveLengthResult, out_dir: str | Path, title: str, position_method: dict | None = None
) -> tuple[Path, Path]:
    """niah.json (+ `position_method`, the settings evaluated, when given) and the heatmap."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    numbers = out_dir / "niah.json"
    data = result.to_dict() if position_method is None else {**result.to_dict(), "position_method": position_method}
    numbers.write_text(json.dumps(data, indent=1) + "\n")
    return numbers, plot_heatmap(result, out_dir / "niah_heatmap.png", title=title)


def method_settings(config: ExperimentConfig, model: Llama) -> dict:
    """The evaluated position method as niah.json records it: its name, its config section
    as set (StRing's shift_ratio, say) and the parameters it resolved to for the evaluated
    model (its training length is the checkpoint's max_position, as in `evaluate`)."""
    return config.eval.position_method.settings(model.config.max_position)


def format_search(result: EffectiveLengthResult) -> str:
    lines = [f"effective length: {result.effective_length}"]
    for row in result.per_length:
        lines.append(
            f"  L={row.length:>6}  pass {row.passed:>4}/{row.tests:<4} = {row.rate:.3f}  "
            f"95% CI [{row.wilson_low:.3f}, {row.wilson_high:.3f}]"
        )
    return "\n".join(lines)


def log_to_wandb(
    result: EffectiveLengthResult, config: ExperimentConfig, heatmap: Path, job: str, out_dir: str | Path
) -> None:
    """One W&B run per evaluation (what a `wandb sweep` over eval settings reads back), written
    under the evaluation's own `out_dir` (`<out_dir>/wandb/`), so the points of a sweep do not
    share one directory."""
    from longctx.wandb_setup import finish_run, start_run

    run = start_run(config, job, out_dir)
    if run is None:  # disabled: wandb need not be installed (the GPU image has none)
        return
    import wandb

    table = wandb.Table(
        columns=["length", "tests", "passed", "rate", "wilson_low", "wilson_high"],
        data=[[r.length, r.tests, r.passed, r.rate, r.wilson_low, r.wilson_high] for r in result.per_length],
    )
    run.log(
        {
            "niah/effective_length": result.effective_length,
            "niah/pass_rate": table,
            "niah/heatmap": wandb.Image(str(heatmap)),
        }
    )
    finish_run(run)


def peak_failure_band(depth_recall: list[float], depth_edges: list[float]) -> tuple[float, float]:
    """(low, high) edges of the depth band with the lowest recall (STRING Table 4); the
    first such band on a tie; NaN when no band has an answer."""
    recalls = [(r, i) for i, r in enumerate(depth_recall) if r is not None and not math.isnan(r)]
    if not recalls:
        return (math.nan, math.nan)
    _, band = min(recalls)
    return depth_edges[band], depth_edges[band + 1]


def peak_failure_depth(result: EffectiveLengthResult) -> tuple[float, float]:
    """`peak_failure_band` of a search's depth profile."""
    return peak_failure_band(result.depth_recall, result.depth_edges)
