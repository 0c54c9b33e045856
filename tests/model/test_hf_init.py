"""`pretrain init=DIR` and `sft init=DIR` (Normal and SkipAlign) start from a model saved by
transformers: the first step's logged loss equals transformers' loss on that step's rows,
a few steps train, and `export-hf` of the result reloads in transformers with equal logits.

Labels: our rows carry next-token labels (labels[t] is the target of position t, the last
one possibly the token after the window); transformers shifts `labels` itself. So the
reference appends one input token (it cannot change earlier logits) and passes
[-100] + labels: position t is scored against labels[t] for every t, as ours are."""

import itertools
import json
import shutil

import numpy as np
import pytest
import torch

from longctx import config as config_module
from longctx.batch import IGNORE_INDEX
from longctx.cli import main
from longctx.data.packing import GlobalOrderSampler
from longctx.data.pipeline import packed_rows
from longctx.data.tokenizer import load_tokenizer
from longctx.gpu_checks import prepared_workspace
from longctx.model.checkpoint import load_model
from longctx.train.sft import build_rows
from tests.model.hf_models import build_hf

transformers = pytest.importorskip("transformers")

SHAPE = {"vocab_size": 512, "max_position_embeddings": 256, "rms_norm_eps": 1e-6}
MODEL_FIELDS = {
    "model.vocab_size": 512,
    "model.d_model": 64,
    "model.n_layers": 2,
    "model.n_heads": 4,
    "model.n_kv_heads": 2,
    "model.d_ff": 160,
    "model.norm_eps": 1e-6,
    "model.rope_base": 20000.0,
    "model.max_position": 256,
    "model.tie_embeddings": "true",
}


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    return prepared_workspace(tmp_path_factory.mktemp("hf-init"))


@pytest.fixture(scope="module", params=["llama-tied", "qwen2-tied"])
def hf_dir(request, workspace, tmp_path_factory):
    """A transformers-saved model with the workspace's BPE (built with `tokenizers`) beside it."""
    directory = tmp_path_factory.mktemp(request.param)
    model = build_hf(request.param, **SHAPE)
    model.save_pretrained(directory)
    shutil.copy(workspace / "tokenizer.json", directory / "tokenizer.json")
    return directory, model, request.param


def hf_loss(model, rows: list[dict[str, torch.Tensor]]) -> float:
    """transformers' own loss on our rows (labels aligned as the module docstring says)."""
    batch = {key: torch.stack([row[key] for row in rows]) for key in rows[0]}
    ids = torch.cat([batch["input_ids"], batch["input_ids"][:, :1]], dim=1)
    positions = torch.cat([batch["position_ids"], batch["position_ids"][:, -1:] + 1], dim=1)
    labels = torch.cat([torch.full_like(batch["labels"][:, :1], IGNORE_INDEX), batch["labels"]], dim=1)
    assert (batch["document_ids"] == batch["document_ids"][:, :1]).all()  # one document per row: no mask needed
    with torch.no_grad():
        return model(ids, position_ids=positions, labels=labels).loss.item()


def logged_losses(out_dir) -> list[float]:
    rows = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    return [row["train/loss"] for row in sorted(rows, key=lambda r: r["step"]) if "train/loss" in row]


def check_export(checkpoint, out_dir, tokenizer_path) -> None:
    """export-hf of the trained checkpoint reloads in transformers with our logits."""
    assert main(["export-hf", str(checkpoint), str(out_dir), "--tokenizer", str(tokenizer_path)]) == 0
    ours = load_model(checkpoint).eval()
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(out_dir).eval()
    assert json.loads((out_dir / "config.json").read_text())["tie_word_embeddings"] is True
    ids = torch.randint(0, 512, (1, 100))
    with torch.no_grad():
        assert (ours(ids) - reloaded(ids).logits).abs().max() <= 1e-4


def pretrain_args(workspace, hf_dir, out, kind, **extra) -> list[str]:
    values = {
        **MODEL_FIELDS,
        "model.attention_bias": "qkv" if kind.startswith("qwen2") else "none",
        "model.attention_backend": "sdpa",
        "init": hf_dir,
        "data.path": workspace / "data",
        "data.tokenizer": hf_dir / "tokenizer.json",
        "data.window": 64,
        "data.doc_mask": "false",  # transformers has no document mask: one document per row
        "train.micro_batch_size": 2,
        "train.global_batch_tokens": 512,
        "train.max_steps": 6,
        "train.warmup_steps": 0,
        "train.lr": 3e-3,
        "train.min_lr": 3e-3,
        "train.out_dir": out,
        "train.checkpoint_every_steps": 6,
        "log.wandb_mode": "disabled",
        "log.every_steps": 1,
        "probe.fi": "false",
        **extra,
    }
    return [f"{key}={value}" for key, value in values.items()]


def test_pretrain_init_from_an_hf_directory(workspace, hf_dir, tmp_path):
    directory, hf, kind = hf_dir
    args = pretrain_args(workspace, directory, tmp_path / "run", kind)
    assert main(["pretrain", *args]) == 0
    config = config_module.load([], args)
    first_step = list(zip(range(8), packed_rows(config.data, [(str(workspace / "data"), 1.0)], eos_id=0), strict=False))
    losses = logged_losses(tmp_path / "run")
    assert losses[0] == pytest.approx(hf_loss(hf, [row for _, row in first_step]), rel=1e-5)
    assert all(np.isfinite(losses)) and losses[-1] < losses[0] - 0.1
    check_export(tmp_path / "run" / "checkpoints" / "last.ckpt", tmp_path / "hf", directory / "tokenizer.json")


@pytest.mark.parametrize(
    "variant, extra",
    [("normal", {}), ("skipalign", {"sft.strategy": "outer", "sft.extended_length": 256})],
)
def test_sft_init_from_an_hf_directory(workspace, hf_dir, tmp_path, variant, extra):
    directory, hf, _ = hf_dir
    values = {
        "init": directory,
        "data.tokenizer": directory / "tokenizer.json",
        "data.window": 128,
        "train.micro_batch_size": 2,
        "train.global_batch_tokens": 512,
        "train.lr": 3e-3,
        "train.min_lr": 3e-3,
        "train.warmup_steps": 0,
        "train.weight_decay": 0.0,
        "train.out_dir": tmp_path / "run",
        "log.wandb_mode": "disabled",
        "log.every_steps": 1,
        "probe.fi": "false",
        "sft.embedded_samples": 8,
        "sft.max_sample_length": 128,
        "sft.epochs": 4,  # a tiny overfit: 8 samples seen 4 times
        "sft.variant": variant,
        **extra,
    }
    args = [f"{key}={value}" for key, value in values.items()]
    assert main(["sft", *args]) == 0
    config = config_module.load([], args)
    rows = build_rows(config, load_tokenizer(str(directory / "tokenizer.json")))
    sampler = GlobalOrderSampler(len(rows), seed=config.data.seed, rank=0, world_size=1, start_row=0)
    order = list(itertools.islice(sampler, 4))  # the sampler cycles through epochs without end
    losses = logged_losses(tmp_path / "run")
    assert losses[0] == pytest.approx(hf_loss(hf, [rows[i] for i in order[:4]]), rel=1e-5)
    assert all(np.isfinite(losses)) and np.mean(losses[-2:]) < losses[0] - 0.1
    if variant == "skipalign":
        assert max(rows[i]["position_ids"].max().item() for i in order[:4]) > 128  # skipped positions were scored
    check_export(tmp_path / "run" / "checkpoints" / "last.ckpt", tmp_path / "hf", directory / "tokenizer.json")


def test_pretrain_init_names_what_does_not_fit(workspace, hf_dir, tmp_path, capsys):
    """The YAML's model must be the directory's: a tie, bias or norm epsilon that differs is
    named (the norm's epsilon fixes no shape but changes every logit)."""
    directory, _, kind = hf_dir
    for field, value, message in (
        ("model.norm_eps", 1e-5, "norm_eps: 1e-06 vs 1e-05"),
        ("model.tie_embeddings", "false", "tie_embeddings: True vs False"),
        ("model.attention_bias", "qkvo", f"attention_bias: {'qkv' if kind.startswith('qwen2') else 'none'} vs qkvo"),
    ):
        args = pretrain_args(workspace, directory, tmp_path / "run", kind, **{field: value})
        assert main(["pretrain", *args]) == 2
        assert message in capsys.readouterr().err
