"""`eval.benchmarks.ruler_copy=string` renders vt prompts laid out as the STRING copy of
RULER's generator does: compared against 5 prompts that copy rendered at 4K with the same
Llama-3 tokenizer (../shared/fixtures/ruler_string_copy_vt_4k.jsonl, see its README). The
draws differ, so each prompt is reduced to a skeleton: names and values replaced, each run
of context lines replaced by the set of distinct (line, following whitespace) units it is
made of, its chain-line count and its last unit; the noise-line counts are compared apart."""

import json
import re
from pathlib import Path

import pytest

from longctx.config.eval import BenchmarkConfig
from longctx.eval.prompt_pieces import NOISE
from longctx.eval.ruler import make_sample
from longctx.eval.ruler.engine_task import RulerContexts

FIXTURE = Path(__file__).parents[2].parent / "shared" / "fixtures" / "ruler_string_copy_vt_4k.jsonl"
LENGTH = 4096
NOISE_MARK, CHAIN_MARK = "\x00", "\x01"
STRING_STEP = 10
"""Noise lines the STRING copy adds per step of its length search at 4K (its `incremental`)."""


@pytest.fixture(scope="module")
def reference():
    if not FIXTURE.is_file():
        pytest.skip(f"{FIXTURE} is absent (shared/ is checked out beside the repository)")
    return [json.loads(line) for line in FIXTURE.read_text().splitlines() if line.strip()]


def _collapse(run: re.Match) -> str:
    units = re.findall(rf"[{NOISE_MARK}{CHAIN_MARK}]\s*", run[0])
    body = sorted({repr(unit) for unit in units[:-1]})
    chains = sum(unit.startswith(CHAIN_MARK) for unit in units)
    return f"<lines {', '.join(body)}; {chains} chain lines; last {units[-1]!r}>"


def skeleton(text: str) -> tuple[str, tuple[int, ...]]:
    """The layout of a vt prompt and the noise-line count of each context run (example, task)."""
    text = text.replace(NOISE, NOISE_MARK)
    text = re.sub(r"VAR [A-Z]+ = VAR [A-Z]+ |VAR [A-Z]+ = \d+", CHAIN_MARK, text)
    text = re.sub(r"\b(?:[A-Z]{3}|[A-Z]{5})\b", "NAME", text)
    text = re.sub(r"\b\d{5}\b", "VALUE", text)
    runs = re.findall(rf"(?:[{NOISE_MARK}{CHAIN_MARK}]\s*)+", text)
    return re.sub(rf"(?:[{NOISE_MARK}{CHAIN_MARK}]\s*)+", _collapse, text), tuple(r.count(NOISE_MARK) for r in runs)


def _samples(llama3, copy: str, count: int):
    """Through the config option, as `longctx eval-suite` builds its RULER context."""
    ctx = RulerContexts(BenchmarkConfig(seed=3, ruler_copy=copy)).get(llama3)
    return [make_sample(ctx, "vt", LENGTH, i) for i in range(count)]


def test_fixture_skeletons_agree_and_read_as_the_copy_renders(reference):
    """The skeleton keeps what the copy fixes: the fixture's 5 prompts share one."""
    shapes = {skeleton(row["input"])[0] for row in reference}
    assert len(shapes) == 1
    (shape,) = shapes
    assert shape.startswith(" Memorize and track the chain(s) of variable assignment hidden in the following text. <")
    assert "they are:  NAME NAME NAME NAME NAME\n\n\n\nMemorize and track" in shape
    assert shape.endswith("5 variables are assgined the value VALUE, they are: ")


def test_string_copy_vt_layout_matches_the_string_generator(reference, llama3):
    expected = {skeleton(row["input"]) for row in reference}
    assert len(expected) == 1  # the same noise counts in all 5 too
    ((shape, (example_noise, task_noise)),) = expected
    reference_lengths = [row["length"] for row in reference]
    for sample in _samples(llama3, "string", 3):
        got, noise = skeleton(sample.text)
        assert got == shape
        assert noise[0] == example_noise  # the example's noise: the copy's steps of 5 under 500 tokens
        # the task's haystack: as large as fits, so at least the copy's (which steps by 10 lines)
        assert task_noise <= noise[1] <= task_noise + STRING_STEP
        assert min(reference_lengths) <= len(sample.input_ids) + sample.tokens_to_generate <= LENGTH
        assert sample.input_ids.tolist() == llama3.encode(sample.text)


def test_ruler_copy_vt_layout_differs_from_the_string_generator(reference, llama3):
    """The comparison above can fail: NVIDIA/RULER's layout (lines joined by "\\n", a
    per-sample example, "assigned") gives another skeleton."""
    shape = skeleton(reference[0]["input"])[0]
    got = skeleton(_samples(llama3, "ruler", 1)[0].text)[0]
    assert got != shape
    assert "<lines '\\x00\\n', '\\x01\\n'; 5 chain lines; last '\\x00\\n'>" in got
