"""lm-eval's own `hf` model with attn_implementation=longctx_string, on local tasks whose
requests are longer than StRing's shift S, equals the `longctx` model with the same
method and differs from `hf` with sdpa; `longctx lm-eval` registers the names in the
process that runs lm-eval."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.eval.helpers import evaluate, write_tasks, write_tiny_llama

transformers = pytest.importorskip("transformers")
lm_eval = pytest.importorskip("lm_eval")
from lm_eval.tasks import TaskManager  # noqa: E402

import longctx.eval.lm_eval  # noqa: E402, F401  (registers the `longctx` model)
import longctx.hf_attention as hfa  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

MAX_LENGTH = 32
SHIFT, WINDOW = 12, 4
"""Rolling windows of 32 tokens and S = 12: most requests hold distances >= S."""
REPOSITORY = Path(__file__).parents[2]


@pytest.fixture(scope="module")
def task_manager(tmp_path_factory):
    return TaskManager(include_path=str(write_tasks(tmp_path_factory.mktemp("tasks"))), include_defaults=False)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """The tiny Llama of the lm-eval adapter's tests, with StRing (S = 12, W = 4) applied and saved."""
    directory = write_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))
    model = transformers.AutoModelForCausalLM.from_pretrained(directory)
    hfa.apply(model, "string", shift=SHIFT, local_window=WINDOW).save_pretrained(directory)
    return directory


def responses(results, task):
    samples = sorted(results["samples"][task], key=lambda sample: sample["doc_id"])
    return [[response[0] for response in sample["resps"]] for sample in samples]


def logliks(results, task):
    return [
        float(value[0] if isinstance(value, list | tuple) else value)
        for row in responses(results, task)
        for value in row
    ]


def test_hf_backend_with_longctx_string_equals_the_longctx_backend_and_differs_from_sdpa(model_dir, task_manager):
    common = f"pretrained={model_dir},dtype=float32,max_length={MAX_LENGTH}"
    hf_string = evaluate("hf", f"{common},attn_implementation=longctx_string", task_manager, batch_size=2)
    own = evaluate(
        "longctx",
        f"{common},position_method=string,string.shift={SHIFT},string.local_window={WINDOW}",
        task_manager,
        batch_size=2,
    )
    sdpa = evaluate("hf", common, task_manager, batch_size=2)
    assert responses(hf_string, "tiny_gen") == responses(own, "tiny_gen")
    for task in ("tiny_mc", "tiny_ppl"):
        got, expected, plain = logliks(hf_string, task), logliks(own, task), logliks(sdpa, task)
        assert max(abs(a - b) for a, b in zip(got, expected, strict=True)) <= 1e-4, task
        assert max(abs(a - b) for a, b in zip(got, plain, strict=True)) > 1e-2, task
    for metric, value in own["results"]["tiny_ppl"].items():
        if isinstance(value, float) and not math.isnan(value):
            assert hf_string["results"]["tiny_ppl"][metric] == pytest.approx(value, rel=1e-4), metric


def test_longctx_lm_eval_registers_the_names_for_lm_evals_hf_model(tmp_path):
    """A fresh process: `longctx lm-eval` imports longctx.hf_attention before lm-eval's CLI
    runs (lm-eval's CLI is stubbed: it only reports what it can see)."""
    script = (
        "import sys, lm_eval.__main__ as cli\n"
        "from transformers import AttentionInterface, AttentionMaskInterface\n"
        "def report():\n"
        "    print(sorted(n for n in AttentionInterface._global_mapping if n.startswith('longctx_')),\n"
        "          sorted(n for n in AttentionMaskInterface._global_mapping if n.startswith('longctx_')))\n"
        "cli.cli_evaluate = report\n"
        "from longctx.cli import main\n"
        "main(['lm-eval', '--model', 'hf', '--model_args', 'attn_implementation=longctx_string'])\n"
    )
    environment = {**os.environ, "PYTHONPATH": f"{REPOSITORY / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=environment, check=True)
    names = str(sorted(hfa.ATTENTION_NAMES))
    assert out.stdout.strip() == f"{names} {names}"


@pytest.mark.slow
def test_longctx_lm_eval_runs_lm_evals_hf_model_with_longctx_string(model_dir, tmp_path):
    """The whole command line a user types (lm-eval scans its built-in tasks: ~1 min)."""
    from longctx.cli import main

    tasks = write_tasks(tmp_path / "tasks")
    out = tmp_path / "out"
    arguments = [
        *("--model", "hf", "--model_args", f"pretrained={model_dir},attn_implementation=longctx_string,dtype=float64"),
        *("--tasks", "tiny_mc", "--include_path", str(tasks), "--device", "cpu", "--output_path", str(out)),
    ]
    assert main(["lm-eval", *arguments]) == 0
    (results_file,) = out.rglob("results_*.json")
    assert 0 <= json.loads(results_file.read_text())["results"]["tiny_mc"]["acc,none"] <= 1


def test_a_text_generation_pipeline_runs_the_method(model_dir):
    """pipeline("text-generation") with model_kwargs={"attn_implementation": ...}: the
    stored StRing (S = 12) generates what the model's own generate does, unlike sdpa."""
    import torch

    prompt = "Once upon a time there was a little house by the river, and the river ran past the mill"
    options = {"max_new_tokens": 12, "do_sample": False}

    def pipeline_text(implementation: str) -> str:
        generator = transformers.pipeline(
            "text-generation", model=str(model_dir), model_kwargs={"attn_implementation": implementation}
        )
        return generator(prompt, **options)[0]["generated_text"]

    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="longctx_string")
    ids = tokenizer(prompt, return_tensors="pt")
    assert ids["input_ids"].shape[1] > SHIFT
    with torch.no_grad():
        generated = model.generate(**ids, **options)
    expected = tokenizer.decode(generated[0], skip_special_tokens=True)
    assert pipeline_text("longctx_string") == expected
    assert pipeline_text("sdpa") != expected
