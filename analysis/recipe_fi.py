"""f(i) that each context-extension recipe trains on the embedded corpus: 512-token rows
spread over L_t = 2048 vs full-length 2048-token rows, the same 409,600 tokens each (the
table of docs/context_extension.md). Rows come from `data.pipeline.packed_rows` with the
recipe's `data.position_transform`, exactly as training reads them; no model is involved.

    PYTHONPATH=src python analysis/recipe_fi.py
"""

import numpy as np

from longctx.config import load
from longctx.data.pipeline import packed_rows, position_transform
from longctx.data.dataset_sources import embedded_dataset_dir
from longctx.data.tokenizer import load_tokenizer
from longctx.probes.position_frequency import PositionFrequency

tokenizer = load_tokenizer("bpe-8192")
data = str(embedded_dataset_dir(tokenizer))
TOKENS, TARGET = 409_600, 2048
rows_out = []
for name, overrides in [
    ("full_length", ["data.window=2048", "data.position_transform=none"]),
    ("pose (N=2)", ["data.position_transform=pose"]),
    ("pose (repo)", ["data.position_transform=pose", "data.pose.compat=repo"]),
    ("randpos", ["data.position_transform=randpos"]),
    ("longrecipe", ["data.position_transform=longrecipe"]),
    ("longrecipe (repo)", ["data.position_transform=longrecipe", "data.longrecipe.compat=repo"]),
]:
    cfg = load(["experiments/longrecipe/extend.yaml"], [*overrides, "init=''"])
    window = cfg.data.window
    rows = packed_rows(cfg.data, [(data, 1.0)], tokenizer.eos_id, transform=position_transform(cfg.data, tokenizer))
    counts = PositionFrequency(TARGET, max_position=TARGET)
    for row, _ in zip(rows, range(TOKENS // window), strict=False):
        counts.update({k: v[None] for k, v in row.items()})
    f = counts.relative.numpy().astype(np.int64)
    total = int(f.sum())
    rows_out.append(
        (
            name,
            window,
            total,
            f[1],
            f[512:].sum() / total,
            int(np.flatnonzero(f).max()),
            f[TARGET // 4],
            f[TARGET // 2],
            f[3 * TARGET // 4],
        )
    )
    print(rows_out[-1], flush=True)
print("| recipe | L_c | pairs | f(1) | share at d >= 512 | max d | f(512) | f(1024) | f(1536) |")
print("|---|---|---|---|---|---|---|---|---|")
for name, window, total, one, share, top, a, b, c in rows_out:
    print(f"| {name} | {window} | {total:,} | {one:,} | {share:.3f} | {top} | {a:,} | {b:,} | {c:,} |")
