"""LongRecipe impactful token analysis and sentence selection (§4.1; `longctx impactful-tokens`).

This module holds what needs no model: the analysis of scored tokens and the selection.
Scoring the tokens with the two models is a probe (probes/impactful_scoring.py), so data never
imports the model.

A base model H (window L) and an extended model H' (window L' > L) read the same long
samples. For every token x_t the score of the observed token given its prefix is taken
from both,

    delta_t = S_H'(x_t | x_<t) - S_H(x_t | x_<t)

with S the log-probability (`score="logprob"`, default: comparable across positions and
models) or the raw logit (`score="logit"`: the paper's Eq. 2-3 read literally). Eq. 3 sums
|delta| per token type, Delta(t) = sum_i |delta_i|. The paper keeps the top 20% of token
occurrences by |delta| and reports which token types (parts of speech) they are; the
sentences holding such tokens are kept and the others dropped.

No part-of-speech tagger runs offline from pip alone (NLTK and spaCy fetch their tagger
models from the network), so token types are rule-based classes of the token's text:

    digit   any digit character            punct  only punctuation / symbols
    word    letters (no digit)             space  only whitespace         other  the rest

The anchor classes are those over-represented among the kept occurrences (share among the
top fraction / share among all scored tokens > 1, "lift"); a sentence (data/sentences.py)
is kept when it holds a token of an anchor class. `method="digits"` is the authors'
released heuristic instead: keep every sentence with a digit, and each other sentence
with probability 0.3 (their `select_ratio=0.8` draw `randint(1, 10) >= 8`).

The selection is written as a prepared dataset (litdata items of token ids + EOS,
`lengths.npy`, `prepare.json` with the source's tokenizer), so `data.path` can train on it;
`impactful.json` beside it holds the report.
"""

from __future__ import annotations

import json
import unicodedata
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from litdata import StreamingDataset, optimize

from longctx.data.integrity import item_count
from longctx.data.packing import LENGTHS_FILE
from longctx.data.prepare import MANIFEST_FILE, check_dataset
from longctx.data.sentences import sentence_end_table, sentence_lengths
from longctx.data.tokenizer import Tokenizer
from longctx.errors import DataError

CLASSES = ("digit", "punct", "word", "space", "other")
SCORES = ("logprob", "logit")
DIGITS_KEEP_OTHER = 0.3
"""Share of digit-free sentences the authors' digit heuristic keeps at random."""
REPORT_FILE = "impactful.json"


def token_class(text: str) -> str:
    """Rule-based token type of a token's text (see the module docstring)."""
    if any(character.isdigit() for character in text):
        return "digit"
    stripped = "".join(text.split())
    if not stripped:
        return "space"
    if all(unicodedata.category(character)[0] in "PS" for character in stripped):
        return "punct"
    if any(character.isalpha() for character in stripped):
        return "word"
    return "other"


@dataclass
class Analysis:
    """Scored occurrences and what the top fraction of them is made of."""

    fraction: float
    score: str
    tokens: np.ndarray
    """int64 [N]: the scored (observed) tokens."""
    deltas: np.ndarray
    """float32 [N]: |delta_t| of each."""
    threshold: float = 0.0
    classes: dict = field(default_factory=dict)
    top_tokens: list = field(default_factory=list)
    anchors: list = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "fraction": self.fraction,
            "score": self.score,
            "scored_tokens": len(self.tokens),
            "threshold": self.threshold,
            "classes": self.classes,
            "top_tokens": self.top_tokens,
            "anchor_classes": self.anchors,
        }


def analyse(
    tokens: np.ndarray, deltas: np.ndarray, tokenizer: Tokenizer, fraction: float, score: str, top: int = 30
) -> Analysis:
    """Keep the top `fraction` of occurrences by |delta|; class shares, lifts, Delta(t) per type."""
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    magnitudes = np.abs(np.asarray(deltas, dtype=np.float64))
    keep = max(1, round(fraction * len(magnitudes)))
    order = np.argsort(-magnitudes, kind="stable")
    selected = np.zeros(len(magnitudes), dtype=bool)
    selected[order[:keep]] = True
    analysis = Analysis(
        fraction, score, np.asarray(tokens), magnitudes.astype(np.float32), threshold=float(magnitudes[order[keep - 1]])
    )

    texts = {int(t): tokenizer.decode([int(t)]) for t in np.unique(tokens)}
    kinds = np.asarray([token_class(texts[int(t)]) for t in tokens])
    for kind in CLASSES:
        in_class = kinds == kind
        share_all = float(in_class.mean())
        share_selected = float(in_class[selected].mean())
        analysis.classes[kind] = {
            "tokens": int(in_class.sum()),
            "selected": int((in_class & selected).sum()),
            "share_all": share_all,
            "share_selected": share_selected,
            "lift": share_selected / share_all if share_all else 0.0,
            "delta_sum": float(magnitudes[in_class].sum()),
        }
    analysis.anchors = [kind for kind in CLASSES if analysis.classes[kind]["lift"] > 1.0]

    delta_by_type: Counter[int] = Counter()
    selected_by_type = Counter(int(t) for t in np.asarray(tokens)[selected])
    for token, magnitude in zip(np.asarray(tokens).tolist(), magnitudes.tolist(), strict=False):
        delta_by_type[token] += magnitude
    for token, total in delta_by_type.most_common(top):
        analysis.top_tokens.append(
            {
                "token": token,
                "text": texts[token],
                "class": token_class(texts[token]),
                "delta_sum": total,
                "selected": selected_by_type[token],
            }
        )
    return analysis


class _Identity:
    def __call__(self, item):
        return item


def select_sentences(
    document: np.ndarray, ends_sentence: np.ndarray, keep_sentence, rng: np.random.Generator, keep_other: float
) -> np.ndarray:
    """The document's sentences that `keep_sentence` accepts (others kept with probability
    `keep_other`), concatenated; int32, without EOS."""
    pieces = np.split(document, np.cumsum(sentence_lengths(document, ends_sentence))[:-1])
    kept = [piece for piece in pieces if keep_sentence(piece) or (keep_other and rng.random() < keep_other)]
    return np.concatenate(kept).astype(np.int32) if kept else np.zeros(0, dtype=np.int32)


def write_selection(
    data: str | Path,
    out: str | Path,
    tokenizer: Tokenizer,
    anchor_classes: list[str],
    *,
    keep_other: float,
    seed: int,
    report: dict,
) -> dict:
    """Filter every document of `data` to its anchor sentences; write a prepared dataset."""
    manifest = check_dataset(data, tokenizer)
    out = Path(out)
    ends_sentence = sentence_end_table(tokenizer)
    classes = np.asarray([token_class(tokenizer.decode([t])) for t in range(tokenizer.vocab_size)])
    anchor_token = np.isin(classes, anchor_classes)
    documents = StreamingDataset(str(data), shuffle=False)
    rng = np.random.default_rng(seed)
    selected, tokens_in = [], 0
    for index in range(item_count(documents)):
        document = np.asarray(documents[index]).astype(np.int64)
        body = document[:-1] if document[-1] == manifest["eos_id"] else document
        tokens_in += len(body)
        if len(body) == 0:
            continue
        kept = select_sentences(body, ends_sentence, lambda piece: anchor_token[piece].any(), rng, keep_other)
        if len(kept):
            selected.append(np.append(kept, manifest["eos_id"]).astype(np.int32))
    if not selected:
        raise DataError(f"no sentence of {data} holds a token of the anchor classes {anchor_classes}")
    optimize(
        fn=_Identity(),
        inputs=selected,
        output_dir=str(out),
        chunk_bytes="64MB",
        num_workers=1,
        verbose=False,
        start_method="fork",
    )
    lengths = np.asarray([len(item) for item in selected], dtype=np.int64)
    np.save(out / LENGTHS_FILE, lengths)
    selection = {
        "documents_in": len(documents),
        "documents_out": len(selected),
        "tokens_in": tokens_in,
        "tokens_out": int(lengths.sum() - len(lengths)),
        "anchor_classes": anchor_classes,
        "keep_other": keep_other,
    }
    written = {key: manifest[key] for key in ("tokenizer", "tokenizer_fingerprint", "eos_id", "vocab_size")}
    written.update(
        source=f"impactful-tokens:{data}",
        documents=len(selected),
        tokens=int(lengths.sum()),
        rejected={},
        rejected_items=[],
        complete=True,
    )
    (out / MANIFEST_FILE).write_text(json.dumps(written, indent=2) + "\n")
    (out / REPORT_FILE).write_text(json.dumps({**report, "selection": selection}, indent=2) + "\n")
    return selection


def format_report(report: dict) -> str:
    """Markdown tables: token classes (shares, lift) and the top token types by Delta(t)."""
    lines = []
    if "classes" in report:
        lines += ["| class | tokens | share (all) | share (top) | lift | sum abs(delta) |", "|---|---|---|---|---|---|"]
        for kind, row in report["classes"].items():
            lines.append(
                f"| {kind} | {row['tokens']} | {row['share_all']:.3f} | {row['share_selected']:.3f} | "
                f"{row['lift']:.2f} | {row['delta_sum']:.2f} |"
            )
        lines += ["", "| token | class | Delta(t) | in top |", "|---|---|---|---|"]
        lines += [
            f"| {json.dumps(row['text']).replace('|', chr(92) + '|')} | {row['class']} | {row['delta_sum']:.2f} | {row['selected']} |"
            for row in report["top_tokens"][:15]
        ]
    return "\n".join(lines)
