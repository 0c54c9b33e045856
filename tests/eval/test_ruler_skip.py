"""A RULER task too long for its length is the engine's PromptTooShortError: `eval-suite`
leaves that (task, length) out with a line on stderr and an entry in the table's "skipped",
and the effective-length search skips the length, instead of stopping on the error."""

import numpy as np
import pytest
import torch

from longctx.config import ExperimentConfig
from longctx.config.model import ModelConfig
from longctx.config.position_methods import PositionMethodConfig
from longctx.eval.cells import Cell, CellResult
from longctx.eval.effective_length import NiahConfig, search_effective_length
from longctx.eval.errors import PromptTooShortError
from longctx.eval.ruler import RulerError, make_sample
from longctx.eval.suite_table import format_markdown, run_suite
from longctx.eval.task import Sample, Task
from longctx.model.inference.generation import StopRule
from longctx.model.llama import Llama


@pytest.mark.parametrize("task", ["niah_single_1", "fwe", "vt"])
def test_a_length_below_the_template_is_prompt_too_short(ruler_ctx, task):
    with pytest.raises(PromptTooShortError, match="length=64") as caught:
        make_sample(ruler_ctx, task, 64, 0)
    assert isinstance(caught.value, RulerError)  # still a RulerError for callers that catch that


class Numbers:
    name = "numbers"

    def decode(self, ids):
        return " ".join(map(str, ids))


class RulerAtShortLengths(Task):
    """RULER's niah_single_1 at 64 tokens (too short: RULER refuses it); prompts of random ids
    at longer lengths."""

    name = "ruler-short"

    def __init__(self, ctx):
        self.ctx = ctx

    def samples(self, seed, length, count, tokenizer):
        if length < 100:
            make_sample(self.ctx, "niah_single_1", 64, 0)
        ids = np.random.default_rng([seed, length]).integers(0, 256, length - 8)
        return [Sample(i, tuple(int(t) for t in ids), 2, StopRule(), ("1",)) for i in range(count)]

    def score(self, sample, generation):
        return 0.0


def test_eval_suite_skips_a_ruler_length_with_a_line(ruler_ctx, tmp_path, capsys):
    torch.manual_seed(0)
    model = Llama(ModelConfig.from_preset("debug", vocab_size=256, max_position=256)).eval()
    config = ExperimentConfig()
    config.eval.benchmarks.samples_per_length = 1
    arms = {"rope": PositionMethodConfig(name="rope")}
    table, results = run_suite(
        {"m": model},
        arms,
        config,
        Numbers(),
        [RulerAtShortLengths(ruler_ctx)],
        [64, 128],
        suite="ruler",
        cells_dir=tmp_path,
    )
    assert [r.cell.length for r in results] == [128]
    assert [(s["task"], s["length"]) for s in table["skipped"]] == [("ruler-short", 64)]
    assert "skipped ruler-short at length 64 (m, rope)" in capsys.readouterr().err
    assert "skipped: ruler-short at 64" in format_markdown(table)


def test_effective_length_search_skips_a_ruler_length(ruler_ctx):
    def run_length(length):
        make_sample(ruler_ctx, "niah_single_1", length, 0)  # raises below RULER's template
        return CellResult(
            Cell("m", "rope", "ruler-niah_single_1", length), [{"score": 1.0}], {"score": 1.0, "count": 1}
        )

    result = search_effective_length(run_length, NiahConfig(lengths=[64, 512]))
    assert result.skipped_lengths == [64] and result.effective_length == 512
