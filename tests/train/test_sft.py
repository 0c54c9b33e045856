"""`longctx sft` end to end on CPU: every variant fine-tunes a pretrained model for a few
steps; the f(i) histogram reflects each variant's positions; the rows' order resumes."""

import json

import numpy as np
import pytest
import torch

from longctx.cli import main
from longctx.data.packing import GlobalOrderSampler
from longctx.model.checkpoint import load_model
from tests.train.helpers import overrides as pretrain_overrides
from tests.train.helpers import poison, sft_args


@pytest.fixture(scope="module")
def pretrained(workspace):
    out = workspace / "sft-base"
    args = pretrain_overrides(
        workspace, out, **{"train.max_steps": 2, "probe.fi": "false", "data.window": 128, "model.max_position": 128}
    )
    assert main(["pretrain", *args]) == 0
    return out / "checkpoints" / "last.ckpt"


@pytest.mark.parametrize(
    "variant, extra",
    [
        ("normal", {}),
        ("normal", {"sft.extended_length": 512, "sft.rope_extension": "ntk"}),
        ("packed", {}),
        ("skipalign", {"sft.strategy": "outer", "sft.extended_length": 512, "sft.rope_extension": "ntk"}),
    ],
)
def test_every_variant_fine_tunes_end_to_end(workspace, pretrained, tmp_path, variant, extra):
    args = sft_args(workspace, pretrained, tmp_path, **{"sft.variant": variant, **extra})
    assert main(["sft", *args]) == 0
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    rows = [row for row in lines if "train/loss" in row]  # the f(i) probe adds rows of its own
    assert len(rows) >= 2  # ceil(0.5 epochs x ~21 rows / 4 rows per step)
    assert all(np.isfinite(row["train/loss"]) for row in rows)
    tuned = load_model(tmp_path / "checkpoints" / "last.ckpt")
    base = load_model(pretrained)
    assert not torch.equal(tuned.output.weight, base.output.weight)
    fi = np.load(tmp_path / "fi" / f"fi-step-{len(rows):07d}.npz")
    far = fi["relative"][128:].sum() + fi["overflow"]
    if extra.get("sft.rope_extension") == "ntk":  # scaled to extended_length whatever the variant
        assert tuned.config.rope_scaling.type == "ntk" and tuned.config.max_position == 512
    else:
        assert tuned.config.rope_scaling == base.config.rope_scaling
    if variant == "skipalign":
        assert far > 0  # skipped positions put response queries beyond the 128-token window
    else:
        assert far == 0


def test_niah_after_sft_covers_lengths_beyond_the_window(workspace, pretrained, tmp_path):
    haystack = tmp_path / "haystack.txt"
    haystack.write_text("The grass is green. The sky is blue. " * 400)
    args = sft_args(
        workspace,
        pretrained,
        tmp_path,
        **{
            "sft.niah_after": "true",
            "eval.niah.haystack": haystack,
            "eval.niah.task": "paper",
            "eval.niah.step": 128,
            "eval.niah.tests_per_length": 1,
            "eval.niah.max_new_tokens": 4,
            "sft.epochs": 0.2,
        },
    )
    assert main(["sft", *args]) == 0
    result = json.loads((tmp_path / "niah_after_sft" / "niah.json").read_text())
    assert max(result["lengths"] + result["skipped_lengths"]) == 256  # 2 x the base model's 128


def test_a_stopped_sft_run_leaves_the_niah_check_to_its_resumed_end(workspace, pretrained, tmp_path, capsys):
    stopper = json.dumps([{"class_path": "tests.train.helpers.StopAfterFirstStep"}])
    args = sft_args(workspace, pretrained, tmp_path, **{"sft.niah_after": "true", "train.callbacks": stopper})
    assert main(["sft", *args]) == 0
    assert "sft: stopped at step 1 of" in capsys.readouterr().out
    assert not (tmp_path / "niah_after_sft").exists()


def test_a_non_finite_sft_step_stops_the_run_without_a_checkpoint(workspace, pretrained, tmp_path, capsys):
    """SFT trains through the same module and guard as pretraining (train/nonfinite.py)."""
    args = sft_args(workspace, pretrained, tmp_path, **{"train.callbacks": poison(1)})
    assert main(["sft", *args]) == 2
    assert "train/grad_norm = nan at optimizer step 1" in capsys.readouterr().err
    assert not (tmp_path / "checkpoints" / "last.ckpt").exists()


def test_sft_needs_init(workspace, tmp_path, capsys):
    args = [a for a in sft_args(workspace, "x", tmp_path) if not a.startswith("init=")]
    assert main(["sft", *args]) == 2
    assert "init: SFT starts from a trained model" in capsys.readouterr().err


def test_global_order_sampler_is_world_size_invariant():
    def take(sampler, n):
        out = []
        for index in sampler:
            out.append(index)
            if len(out) == n:
                return out

    single = take(GlobalOrderSampler(10, seed=3), 30)
    assert sorted(single[:10]) == list(range(10)) and sorted(single[10:20]) == list(range(10))
    assert single[:10] != single[10:20]  # reshuffled per epoch
    ranks = [take(GlobalOrderSampler(10, seed=3, rank=r, world_size=3), 10) for r in range(3)]
    assert [ranks[k % 3][k // 3] for k in range(30)] == single
    assert take(GlobalOrderSampler(10, seed=3, rank=1, world_size=3, start_row=7), 3) == [
        single[7],
        single[10],
        single[13],
    ]


def test_niah_after_sft_runs_on_the_evaluation_device(workspace, pretrained, tmp_path, monkeypatch):
    """The fine-tuned checkpoint is moved to eval.device before the search (on a GPU machine
    it had stayed on the CPU); `meta` stands in for the GPU, and the search is intercepted."""
    import shutil

    from longctx import config as config_module
    from longctx.data.tokenizer import load_tokenizer
    from longctx.eval.niah import evaluation
    from longctx.train.sft import niah_after_sft

    (tmp_path / "checkpoints").mkdir()
    shutil.copy(pretrained, tmp_path / "checkpoints" / "last.ckpt")
    config = config_module.load([], sft_args(workspace, pretrained, tmp_path))
    searched_on = []

    def intercepted(model, *args, **kwargs):
        searched_on.append(model.tok_embeddings.weight.device)
        raise InterruptedError

    monkeypatch.setattr(evaluation, "evaluation_device", lambda config: torch.device("meta"))
    monkeypatch.setattr(evaluation, "evaluate", intercepted)
    monkeypatch.setattr(evaluation, "load_haystack", lambda config, tokenizer: None)
    with pytest.raises(InterruptedError):
        niah_after_sft(config, load_tokenizer(config.data.tokenizer), 128)
    assert searched_on == [torch.device("meta")]


def test_max_steps_set_for_sft_is_an_error_naming_sft_epochs(tmp_path, capsys):
    """`longctx sft` computes train.max_steps from sft.epochs: a value the user sets would be
    replaced silently (4 steps asked, 2 epochs trained), so it is refused, naming both keys
    and where the value was set."""
    from longctx.cli import main

    args = ["sft", "experiments/sft/tiny_skipalign.yaml", f"init={tmp_path / 'missing.ckpt'}", "train.max_steps=4"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "train.max_steps" in err and "sft.epochs" in err and "override 'train.max_steps=4'" in err
    # the shipped SFT configs set no train.max_steps (they inherit experiments/base.yaml)
    from longctx import config as config_module

    for path in ("experiments/sft/tiny_normal.yaml", "experiments/replicate/cpu_sft.yaml"):
        assert "train.max_steps" not in config_module.where_set([path])
