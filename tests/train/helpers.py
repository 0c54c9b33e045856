"""The small pretraining workspace shared by the training tests."""

import itertools
import json
from pathlib import Path

from longctx.data.corpus import embedded_documents
from longctx.data.prepare import prepare
from longctx.data.tokenizer import train_bpe

STEPS = 6


def make_workspace(root: Path) -> Path:
    """A small prose corpus, a 512-token BPE trained on it, and the prepared dataset."""
    texts = [doc.text for doc in itertools.islice(embedded_documents(("prose",)), 120)]
    corpus = root / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    train_bpe(texts, vocab_size=512, path=root / "tokenizer.json")
    prepare(str(corpus), root / "data", str(root / "tokenizer.json"), verbose=False)
    return root


def overrides(workspace: Path, out_dir: Path, **extra) -> list[str]:
    values = {
        "model.preset": "debug",
        "model.vocab_size": 512,
        "model.max_position": 64,
        "model.attention_backend": "varlen",
        "data.path": workspace / "data",
        "data.tokenizer": workspace / "tokenizer.json",
        "data.window": 64,
        "train.micro_batch_size": 2,
        "train.global_batch_tokens": 512,  # 8 rows: accumulation 4 on one process, 2 on two
        "train.max_steps": STEPS,
        "train.warmup_steps": 2,
        "train.lr": 3e-3,
        "train.min_lr": 3e-4,
        "train.checkpoint_every_steps": 3,
        "train.out_dir": out_dir,
        "log.wandb_mode": "offline",
        "log.every_steps": 1,
        "probe.fi_every_steps": 2,
        **extra,
    }
    return [f"{key}={value}" for key, value in values.items()]
