"""The in-training NIAH probe's search on a checkpoint, FSDP2-sharded over the torchrun ranks
as the training callback runs it, or unsharded in one process.

    python tests/composition/sharded_niah.py CKPT OUT CONFIG.yaml... [key=value ...]
    python -m torch.distributed.run --nproc-per-node=2 --standalone tests/composition/sharded_niah.py ...

Writes (rank 0) OUT/cells/ (the engine's cells, as the probe writes them) and OUT/logits.pt:
the full-forward logits of every sample prompt of the search's first length.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist


def main(argv: list[str]) -> None:
    from longctx import config as config_module
    from longctx.cli.common import split_overrides, user_tokenizer
    from longctx.eval.niah.evaluation import evaluate, load_haystack, search_task
    from longctx.model.checkpoint import load_model
    from longctx.model_tokenizer import tokenizer_for_model
    from longctx.train.callbacks.niah import probe_settings
    from longctx.train.module import shard_model

    checkpoint, out = Path(argv[0]), Path(argv[1])
    paths, overrides = split_overrides(argv[2:])
    config = config_module.load(paths, overrides)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        dist.init_process_group("gloo")
    torch.set_num_threads(1)
    model = load_model(checkpoint).eval()
    if world > 1:
        from torch.distributed.device_mesh import init_device_mesh

        shard_model(model, init_device_mesh("cpu", (world,)), config.train.precision)
    tokenizer = tokenizer_for_model(None, user_tokenizer(config.data.tokenizer))  # the run's own
    haystack = load_haystack(config, tokenizer)
    settings = probe_settings(config, model)
    rank0 = not dist.is_initialized() or dist.get_rank() == 0
    evaluate(model, config, tokenizer, haystack, settings=settings, cells_dir=out / "cells" if rank0 else None)
    task = search_task(settings, config, haystack)
    samples = first_samples(task, settings, tokenizer)
    with torch.no_grad():
        logits = [model(torch.tensor([sample.prompt_ids]))[0].float() for sample in samples]
    if rank0:
        torch.save(logits, out / "logits.pt")
    if dist.is_initialized():
        dist.destroy_process_group()


def first_samples(task, settings, tokenizer) -> list:
    """The samples of the search's first length that holds the task's prompt (the search
    leaves out a length below the prompt's fixed tokens: 228 for `paper` under bpe-512)."""
    from longctx.eval.niah.needles import NiahPromptTooShortError

    for length in settings.evaluated_lengths():
        try:
            return task.samples(settings.seed, length, settings.tests_per_length, tokenizer)
        except NiahPromptTooShortError:
            continue
    raise ValueError(f"no length of {settings.evaluated_lengths()} holds the task's prompt")


if __name__ == "__main__":
    main(sys.argv[1:])
