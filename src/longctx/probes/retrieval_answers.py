"""Answer loss on held-out retrieval documents: does the model copy values, or only the format?

docs/design.md §13's first milestone is a base model that retrieves at all; NIAH's substring
scoring gives 0 both to a model that has not learned the answer format and to one that
writes the format with wrong digits. This probe separates them. For held-out documents of
the retrieval source (data/retrieval.py, another seed than training's) that fit in the
window, one teacher-forced forward gives, over the digit tokens of every answer,

    answer_loss     mean cross-entropy (nats/token); ln 10 = 2.30 is "digits at chance"
    value_exact     share of answers whose every digit is predicted

`value_exact` by needle-question distance is the miniature's Fig. 4: where retrieval fails.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import numpy as np
import torch
import torch.nn.functional as F

from longctx.config.data import RetrievalConfig
from longctx.data.retrieval import filler_sentences, make_document
from longctx.errors import DataError

HELD_OUT_SEED_OFFSET = 1_000_003
"""Held-out documents use seed config.seed + this: never a training document."""


@torch.no_grad()
def answer_metrics(
    model,
    tokenizer,
    config: RetrievalConfig,
    window: int,
    documents: int = 64,
    distance_bins: tuple[int, ...] = (0, 64, 128, 256, 512, 1024, 2048, 4096),
) -> dict[str, float]:
    """Teacher-forced answer metrics over `documents` held-out documents no longer than `window`."""
    held_out = replace(config, seed=config.seed + HELD_OUT_SEED_OFFSET)
    filler = filler_sentences()
    losses: list[float] = []
    exact: list[bool] = []
    distances: list[int] = []
    index = 0
    model.eval()
    # the training probe calls it on the GPU model; a parameterless stand-in runs on the CPU
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    while len(exact) < documents * (held_out.queries + held_out.facts * held_out.list_query) and index < 50 * documents:
        doc = make_document(held_out, index, filler)
        index += 1
        ids = tokenizer.encode(doc.text)
        if len(ids) > window:
            continue
        logits = model(torch.tensor([ids], device=device)).float()[0].cpu()
        log_probs = F.log_softmax(logits, dim=-1)
        fact_starts = [len(tokenizer.encode(doc.text[:offset])) for offset in doc.fact_offsets]
        for fact, offset in doc.answer_offsets:
            start = len(tokenizer.encode(doc.text[:offset]))
            span = len(tokenizer.encode(doc.values[fact]))
            targets = torch.tensor(ids[start : start + span])
            predicted = log_probs[start - 1 : start + span - 1]
            losses += (-predicted.gather(1, targets[:, None])[:, 0]).tolist()
            exact.append(bool((predicted.argmax(-1) == targets).all()))
            distances.append(start - fact_starts[fact])
    if not exact:
        raise DataError(f"no held-out retrieval document fits in window={window}; lower filler_max")
    exact_arr, dist_arr = np.asarray(exact), np.asarray(distances)
    result = {
        "answer_loss": float(np.mean(losses)),
        "digit_chance_loss": math.log(10),
        "value_exact": float(exact_arr.mean()),
        "answers": len(exact),
    }
    for low, high in itertools.pairwise(distance_bins):
        inside = (dist_arr >= low) & (dist_arr < high)
        if inside.any():
            result[f"value_exact_{low}_{high}"] = float(exact_arr[inside].mean())
            result[f"answers_{low}_{high}"] = int(inside.sum())
    return result
