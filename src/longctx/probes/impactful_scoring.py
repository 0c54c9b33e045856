"""LongRecipe impactful tokens, the model side (§4.1; `longctx impactful-tokens`): score every
token of long samples under a base model H and an extended model H', then analyse the
differences and write the selected sentences (data/impactful_selection.py: the analysis, the selection
and their formulas).

    delta_t = S_H'(x_t | x_<t) - S_H(x_t | x_<t)

S is the log-probability of the observed token (`score="logprob"`) or its raw logit
(`score="logit"`, the paper's Eq. 2-3 read literally).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from longctx.data import impactful_selection
from longctx.data.impactful_selection import SCORES
from longctx.data.packing import PackedSource
from longctx.data.tokenizer import Tokenizer
from longctx.errors import DataError
from longctx.model.llama import Llama


@torch.no_grad()
def observed_scores(model: Llama, tokens: torch.Tensor, score: str = "logprob") -> torch.Tensor:
    """S(x_t | x_<t) for t = 1..T-1 of tokens [B, T] (plain causal rows): float32 [B, T-1]."""
    if score not in SCORES:
        raise ValueError(f"score must be one of {SCORES}, got {score!r}")
    logits = model(tokens)[:, :-1].float()
    if score == "logprob":
        logits = torch.log_softmax(logits, dim=-1)
    return logits.gather(-1, tokens[:, 1:, None])[..., 0]


def score_differences(base: Llama, extended: Llama, tokens: torch.Tensor, score: str = "logprob") -> torch.Tensor:
    """delta_t = S_H'(x_t | x_<t) - S_H(x_t | x_<t): float32 [B, T-1] (signed)."""
    return observed_scores(extended, tokens, score) - observed_scores(base, tokens, score)


def score_samples(
    base: Llama, extended: Llama, data: str | Path, *, samples: int, length: int, score: str, device: str = "cpu"
) -> tuple[np.ndarray, np.ndarray]:
    """Observed tokens and their |delta| over `samples` consecutive `length`-token stretches
    of the dataset's stream (documents in stored order, as one causal sequence)."""
    stream = PackedSource(data, seed=0, shuffle=False)
    if samples * length > stream.epoch_tokens:
        raise DataError(
            f"{data} holds {stream.epoch_tokens} tokens; {samples} samples x {length} tokens need more "
            "(lower --samples or --length)"
        )
    base, extended = base.to(device).eval(), extended.to(device).eval()
    observed, magnitudes = [], []
    for sample in range(samples):
        tokens = stream.read(sample * length, length)[None].to(device)
        observed.append(tokens[0, 1:].cpu().numpy())
        magnitudes.append(score_differences(base, extended, tokens, score)[0].abs().cpu().numpy())
    return np.concatenate(observed), np.concatenate(magnitudes)


def impactful_tokens(
    data: str | Path,
    out: str | Path,
    tokenizer: Tokenizer,
    *,
    method: str,
    base: str = "",
    extended: str = "",
    samples: int = 0,
    length: int = 0,
    score: str = "logprob",
    fraction: float = 0.2,
    anchor_classes: list[str] | None = None,
    keep_other: float | None = None,
    seed: int = 0,
    device: str = "cpu",
) -> tuple[dict, dict]:
    """The whole workflow: (report, selection) after writing the selected sentences of `data`
    to `out`. method="digits" keeps sentences with a digit (the authors' heuristic, no
    model); method="logits" scores `samples` stretches of `length` tokens (0 = the extended
    model's max_position) under the checkpoints `base` and `extended`, keeps the sentences
    holding a token of the anchor classes (given, else those the analysis finds) and the
    others with probability `keep_other` (default 0)."""
    from longctx.model.checkpoint import load_model

    if method == "digits":
        report: dict[str, object] = {"method": "digits"}
        anchors = ["digit"]
        keep = impactful_selection.DIGITS_KEEP_OTHER if keep_other is None else keep_other
    else:
        base_model, extended_model = load_model(base), load_model(extended)
        length = length or extended_model.config.max_position
        tokens, deltas = score_samples(
            base_model, extended_model, data, samples=samples, length=length, score=score, device=device
        )
        analysis = impactful_selection.analyse(tokens, deltas, tokenizer, fraction, score)
        report = {
            "method": "logits",
            "base": base,
            "extended": extended,
            "samples": samples,
            "length": length,
            **analysis.to_dict(),
        }
        anchors = anchor_classes or analysis.anchors
        keep = keep_other or 0.0
    selection = impactful_selection.write_selection(
        data, out, tokenizer, anchors, keep_other=keep, seed=seed, report=report
    )
    return report, selection
