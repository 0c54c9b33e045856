"""NIAH cells decoded under one `eval.cuda_decoding` mode with every step's logits kept, and two
such decodings compared step by step (benchmarks/main_job_gpu.py, phase `niah-decoding`).

An untrained model fails every NIAH test in every mode, so equal pass rates prove nothing;
equal tokens and near logits do. Greedy decoding of a nearly untrained model meets near
ties (two tokens whose logits differ by less than bf16's rounding), where a correct kernel
may pick the other token; from then on the two rows decode different inputs and are no
longer comparable. So `compare_logits` compares each row's steps up to and including its
first different token, every one within the bound. A different token at a step within the
bound is a near tie by arithmetic: for the other token to win, the two logits' difference
must move by the eager margin, so the margin is at most twice the largest logit difference.
The different tokens are counted and reported beside the verdict.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import torch

from longctx import config as config_module
from longctx.data.tokenizer import load_tokenizer
from longctx.eval.niah.evaluation import evaluate, load_haystack, search_settings
from longctx.model.checkpoint import load_model
from longctx.model.inference import kernel as decode_kernel
from longctx.model.inference.generation import observe_logits

Batches = list[list[torch.Tensor]]
"""Per decoded batch, per step: the logits [rows, vocab] (float32, on the CPU)."""


@contextlib.contextmanager
def counting(counts: dict[str, int]) -> Iterator[None]:
    """Count CUDA graph replays and the decoding kernel's calls (Python-side: a replayed
    graph runs the kernel without calling it), so a mode that did not engage is seen."""
    replay = torch.cuda.CUDAGraph.replay
    attend = decode_kernel.decode_attend

    def counted_replay(graph, *args, **kwargs):
        counts["graph replays"] += 1
        return replay(graph, *args, **kwargs)

    def counted_attend(*args, **kwargs):
        counts["kernel calls"] += 1
        return attend(*args, **kwargs)

    torch.cuda.CUDAGraph.replay = counted_replay  # type: ignore[method-assign]
    decode_kernel.decode_attend = counted_attend
    try:
        yield
    finally:
        torch.cuda.CUDAGraph.replay = replay  # type: ignore[method-assign]
        decode_kernel.decode_attend = attend


def decode_niah(checkpoint: Path, arguments: list[str], mode: str, cells: Path) -> dict:
    """The NIAH cells of the config `arguments` make (eval.niah.lengths, each in full) decoded
    from `checkpoint` with `eval.cuda_decoding=mode` into `cells`: {"logits": Batches,
    "outputs": [(cell, index, text)], "graph replays": n, "kernel calls": n}."""
    config = config_module.load([], [*arguments, f"eval.cuda_decoding={mode}"])
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = load_model(checkpoint, device=device)
    tokenizer = load_tokenizer(config.data.tokenizer)
    haystack = load_haystack(config, tokenizer)
    batches: Batches = []

    def keep(step: int, logits: torch.Tensor) -> None:
        if step == 0:
            batches.append([])
        batches[-1].append(logits.float().cpu())  # a graph's buffer: the next replay overwrites it

    counts = {"graph replays": 0, "kernel calls": 0}
    with counting(counts), observe_logits(keep):
        evaluate(model, config, tokenizer, haystack, settings=search_settings(config, model), cells_dir=cells)
    outputs = []
    for path in sorted(cells.rglob("samples.jsonl")):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            outputs.append((path.parent.name, record["index"], record["text"]))
    return {"logits": batches, "outputs": sorted(outputs), **counts}


def compare_logits(expected: Batches, got: Batches, bound: float) -> dict:
    """Each row's steps, up to its first different token, compared by the relative L2 error
    of the logits (module docstring): {"within bound", "compared steps", "worst" (error,
    batch, row, step), "different tokens", "widest margin at a different token"}."""
    shapes = [[b[0].shape for b in expected], [b[0].shape for b in got]]
    if shapes[0] != shapes[1]:  # the same prompts make the same batches in every mode
        return {"within bound": False, "compared steps": 0, "worst": f"different batches {shapes}"}
    worst = (0.0, -1, -1, -1)
    compared = different = 0
    margin = 0.0
    for batch, (steps_e, steps_g) in enumerate(zip(expected, got, strict=True)):
        for row in range(steps_e[0].shape[0]):
            for step, (e, g) in enumerate(zip(steps_e, steps_g, strict=False)):
                e_row, g_row = e[row], g[row]
                error = float((g_row - e_row).norm() / e_row.norm().clamp_min(1e-30))
                compared += 1
                worst = max(worst, (error, batch, row, step))
                if int(e_row.argmax()) != int(g_row.argmax()):
                    different += 1
                    top = e_row.topk(2).values
                    margin = max(margin, float(top[0] - top[1]))
                    break  # the rows now decode different tokens
    return {
        "within bound": worst[0] <= bound,
        "compared steps": compared,
        "worst": {"error": worst[0], "batch": worst[1], "row": worst[2], "step": worst[3]},
        "different tokens": different,
        "widest margin at a different token": margin,
    }
