"""`longctx lm-eval ARGS...` (cli/harness_commands.py): lm-eval's own command line, every argument
passed on untouched, with the `longctx` model registered."""

import json

import pytest

from longctx.cli import main

lm_eval = pytest.importorskip("lm_eval")


def test_arguments_reach_lm_evals_cli_untouched_with_longctx_registered(monkeypatch):
    import lm_eval.__main__

    seen = {}

    def cli_evaluate():
        import sys

        from lm_eval.api.registry import get_model

        seen["argv"] = list(sys.argv)
        seen["model"] = get_model("longctx").__name__
        seen["hf"] = get_model("hf").__name__  # lm-eval's own models stay reachable

    monkeypatch.setattr(lm_eval.__main__, "cli_evaluate", cli_evaluate)
    arguments = ["--model", "longctx", "--model_args", "pretrained=x", "string.shift=8", "--tasks", "t", "-h"]
    assert main(["lm-eval", *arguments]) == 0
    assert seen == {"argv": ["lm-eval", *arguments], "model": "LongctxLM", "hf": "HFLM"}


@pytest.mark.slow
def test_lm_eval_runs_rulers_niah_and_a_local_task_with_string(tmp_path):
    """The whole path a user takes (lm-eval scans its ~15k built-in task configs: ~1 min):
    lm-eval's RULER niah_single_1 (generated offline: its repeat haystack needs no download)
    at 384 tokens and a local multiple-choice task, on a tiny HF Llama under StRing."""
    from tests.eval.helpers import write_tasks, write_tiny_llama

    model_dir, tasks = write_tiny_llama(tmp_path / "model"), write_tasks(tmp_path / "tasks")
    out = tmp_path / "out"
    arguments = [
        *("--model", "longctx", "--model_args", f"pretrained={model_dir}", "position_method=string"),
        *("string.shift=40", "string.local_window=4", "max_length=512", "--device", "cpu"),
        *("--tasks", "niah_single_1", "tiny_mc", "--include_path", str(tasks), "--limit", "2"),
        *("--metadata", '{"max_seq_lengths": [384]}', "--output_path", str(out)),
    ]
    assert main(["lm-eval", *arguments]) == 0
    (results_file,) = out.rglob("results_*.json")
    results = json.loads(results_file.read_text())["results"]
    assert 0 <= results["niah_single_1"]["384,none"] <= 1
    assert 0 <= results["tiny_mc"]["acc,none"] <= 1
