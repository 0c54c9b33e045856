"""One tiny real pretraining run (f(i) and NIAH probes on, W&B offline) and a small StRing
W x S ablation on its checkpoint, shared by the analysis tests (built once per session)."""

import itertools
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from longctx.data.corpus import embedded_documents
from longctx.gpu_checks import prepared_workspace
from tests.train.helpers import STEPS, overrides

WINDOW = 256
"""The 512-token BPE spells the NIAH prompt in ~150 tokens: lengths below it are skipped."""
ABLATION = [(8, 0.25), (8, 0.5), (16, 0.25), (16, 0.5)]
"""StRing (local_window W, shift_ratio S) points of the fixture's Figure 7."""

EVAL = {
    "eval.niah.step": 64,
    "eval.niah.tests_per_length": 2,
    "eval.niah.max_new_tokens": 8,
}


def _eval_overrides(haystack: Path) -> dict:
    return {**EVAL, "eval.niah.haystack": haystack}


def _pretrain(workspace: Path, haystack: Path, out: Path) -> None:
    args = overrides(
        workspace,
        out,
        **{
            "model.max_position": WINDOW,
            "data.window": WINDOW,
            "train.global_batch_tokens": 2 * WINDOW,
            "probe.niah_every_steps": 3,
            "probe.niah_tests_per_length": 2,
            **_eval_overrides(haystack),
        },
    )
    env = dict(os.environ, WANDB_SILENT="true", OMP_NUM_THREADS="1")
    env.pop("WANDB_API_KEY", None)
    done = subprocess.run(
        [sys.executable, "-m", "longctx", "pretrain", *args],
        env=env,
        check=False,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def _ablation(workspace: Path, haystack: Path, checkpoint: Path, out: Path) -> Path:
    """What `longctx niah CKPT eval.position_method...=... --out DIR` writes, for rope and a
    W x S grid of StRing, through the same functions; one point is also logged to W&B offline."""
    from longctx.config import load
    from longctx.data.tokenizer import load_tokenizer
    from longctx.eval.niah.evaluation import evaluate, load_haystack, log_to_wandb, write_result
    from longctx.model.checkpoint import load_model

    base = [
        f"{key}={value}"
        for key, value in {
            **_eval_overrides(haystack),
            "data.tokenizer": workspace / "tokenizer.json",
            "model.max_position": WINDOW,
            "data.window": WINDOW,
            "log.wandb_mode": "offline",
            "train.out_dir": out / "fixture-wandb",
        }.items()
    ]
    tokenizer = load_tokenizer(str(workspace / "tokenizer.json"))
    model = load_model(checkpoint)
    config = load([], base)
    haystack_tokens = load_haystack(config, tokenizer)
    points = [("name=rope", ["eval.position_method.name=rope"])] + [
        (
            f"name=string,local_window={w},shift_ratio={s}",
            [
                "eval.position_method.name=string",
                f"eval.position_method.string.local_window={w}",
                f"eval.position_method.string.shift_ratio={s}",
            ],
        )
        for w, s in ABLATION
    ]
    for name, extra in points:
        config = load([], [*base, *extra])
        result = evaluate(model, config, tokenizer, haystack_tokens)
        _, heatmap = write_result(result, out / "fixture" / name, name)
        if name.endswith(f"local_window={ABLATION[0][0]},shift_ratio={ABLATION[0][1]}"):
            log_to_wandb(result, config, heatmap, job="niah", out_dir=out / "fixture-wandb")
    return out


@pytest.fixture(scope="session")
def fixture_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("analysis")
    (root / "workspace").mkdir()
    workspace = prepared_workspace(root / "workspace")
    haystack = root / "haystack.txt"
    haystack.write_text("\n".join(doc.text for doc in itertools.islice(embedded_documents(("prose",)), 30)))
    run = root / "runs" / "tiny"
    _pretrain(workspace, haystack, run)
    ablation = _ablation(workspace, haystack, run / "checkpoints" / "last.ckpt", root / "ablation")
    return SimpleNamespace(
        root=root, workspace=workspace, run=run, ablation=ablation, steps=STEPS, wandb_eval=ablation / "fixture-wandb"
    )


SFT_WINDOW = 128
"""The original window of the SFT fixture: the base model's and the SFT rows' length."""
SFT_VARIANTS = {
    "normal": {},
    "skipalign": {"sft.strategy": "outer", "sft.extended_length": 4 * SFT_WINDOW, "sft.rope_extension": "ntk"},
}


@pytest.fixture(scope="session")
def sft_runs(tmp_path_factory):
    """A tiny pretrained model and two short `longctx sft` runs of it (normal and skipalign,
    f(i) probe on, NIAH after SFT, W&B disabled), as tests/train/test_sft.py makes them."""
    from longctx.cli import main
    from tests.train.helpers import sft_args

    root = tmp_path_factory.mktemp("skipalign")
    (root / "workspace").mkdir()
    workspace = prepared_workspace(root / "workspace")
    base = root / "base"
    assert (
        main(
            [
                "pretrain",
                *overrides(
                    workspace,
                    base,
                    **{
                        "train.max_steps": 2,
                        "probe.fi": "false",
                        "data.window": SFT_WINDOW,
                        "model.max_position": SFT_WINDOW,
                        "log.wandb_mode": "disabled",
                    },
                ),
            ]
        )
        == 0
    )
    haystack = root / "haystack.txt"
    haystack.write_text("The grass is green. The sky is blue. " * 400)
    niah = {
        "sft.niah_after": "true",
        "eval.niah.haystack": haystack,
        "eval.niah.task": "paper",
        "eval.niah.step": SFT_WINDOW,
        "eval.niah.tests_per_length": 1,
        "eval.niah.max_new_tokens": 4,
    }
    runs = {}
    for variant, extra in SFT_VARIANTS.items():
        runs[variant] = root / "runs" / variant
        args = sft_args(
            workspace, base / "checkpoints" / "last.ckpt", runs[variant], **{"sft.variant": variant, **niah, **extra}
        )
        assert main(["sft", *args]) == 0
    return SimpleNamespace(root=root, runs=runs, window=SFT_WINDOW)


EXTENSION_TARGET = 256
"""The fixture's target length L_t; recipes train 64-token rows (full-length: 256)."""
EXTENSION_RECIPES = {
    "full_length": {"data.window": EXTENSION_TARGET, "data.position_transform": "none"},
    "pose": {"data.position_transform": "pose"},
    "randpos": {"data.position_transform": "randpos"},
    "longrecipe": {"data.position_transform": "longrecipe"},
}


@pytest.fixture(scope="session")
def extension_runs(tmp_path_factory):
    """A tiny model pretrained at 64 tokens, extended to 256 by each recipe at equal tokens
    (2 steps of 512 tokens, f(i) and NIAH probes on, W&B disabled), as sweeps/context_extension.yaml
    does at CPU scale."""
    import torch

    from longctx.cli import main

    root = tmp_path_factory.mktemp("extension")
    (root / "workspace").mkdir()
    workspace = prepared_workspace(root / "workspace")
    haystack = root / "haystack.txt"
    haystack.write_text("The grass is green. The sky is blue. " * 400)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        base = root / "base"
        assert (
            main(
                [
                    "pretrain",
                    *overrides(
                        workspace, base, **{"train.max_steps": 2, "probe.fi": "false", "log.wandb_mode": "disabled"}
                    ),
                ]
            )
            == 0
        )
        runs = {}
        for recipe, extra in EXTENSION_RECIPES.items():
            runs[recipe] = root / "runs" / recipe
            assert (
                main(
                    [
                        "pretrain",
                        *overrides(
                            workspace,
                            runs[recipe],
                            **{
                                "init": base / "checkpoints" / "last.ckpt",
                                "model.max_position": EXTENSION_TARGET,
                                "data.target_length": EXTENSION_TARGET,
                                "train.max_steps": 2,
                                "train.checkpoint_every_steps": 2,
                                "probe.fi_every_steps": 2,
                                "probe.niah_every_steps": 2,
                                "probe.niah_tests_per_length": 1,
                                "eval.niah.haystack": haystack,
                                "eval.niah.step": 64,
                                "eval.niah.max_new_tokens": 4,
                                "log.wandb_mode": "disabled",
                                **extra,
                            },
                        ),
                    ]
                )
                == 0
            )
    finally:
        torch.set_num_threads(threads)
    return SimpleNamespace(root=root, runs=runs, target=EXTENSION_TARGET)
