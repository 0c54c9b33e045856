"""From a `data` config to the rows one rank trains on: the one construction of training
rows, used by the trainer, benchmarks/loader.py and analysis/recipe_fi.py.

    sources = prepared_sources(config, tokenizer)                    # data/dataset_sources.py
    rows = packed_rows(config.data, sources, tokenizer.eos_id, rank=r, world_size=w,
                       start_row=step * rows_per_step, transform=position_transform(config.data, tokenizer))

Why one place: the rows a benchmark times or an analysis counts f(i) over must be exactly
the rows training reads (same mixture seeds, packing, document masks and position
transform), and a resumed run must continue the same stream (data/packing.py: global row
`start_row`, rank r of W takes rows r, r + W, ...).
"""

from __future__ import annotations

from longctx.config.data import DataConfig
from longctx.data.packing import PackedRows, PackedSource
from longctx.data.sentences import sentence_end_table
from longctx.data.transforms import PositionTransform


def packed_rows(
    data: DataConfig,
    sources: list[tuple[str, float]],
    eos_id: int,
    *,
    rank: int = 0,
    world_size: int = 1,
    start_row: int = 0,
    transform: PositionTransform | None = None,
    micro_batch_size: int = 1,
    document_granule: int = 1,
) -> PackedRows:
    """The rows one rank trains on: the prepared `sources` [(path, weight)] mixed and packed
    as `data` says (source i shuffled with seed data.seed + i), from global row `start_row`;
    DataLoader workers split them by whole micro-batches of `micro_batch_size` rows;
    `document_granule` g > 1 (packing=documents): every document padded to a multiple of g
    (data/row_padding.py)."""
    return PackedRows(
        [PackedSource(path, seed=data.seed + i) for i, (path, _) in enumerate(sources)],
        [weight for _, weight in sources],
        window=data.window,
        eos_id=eos_id,
        doc_mask=data.doc_mask,
        rank=rank,
        world_size=world_size,
        start_row=start_row,
        transform=transform,
        packing=data.packing,
        long_documents=data.long_documents,
        micro_batch_size=micro_batch_size,
        mask_cut_answers=data.mask_cut_answers,
        document_granule=document_granule,
    )


def position_transform(data: DataConfig, tokenizer) -> PositionTransform | None:
    """The `data.position_transform` (None for `none`), built for this tokenizer: LongRecipe
    needs the tokenizer's sentence-ending tokens (data/sentences.py)."""
    if data.position_transform == "none":
        return None
    ends_sentence = None
    if data.position_transform == "longrecipe":
        ends_sentence = sentence_end_table(tokenizer, data.longrecipe.delimiters)
    return PositionTransform(
        data.position_transform,
        data.target_length,
        data.seed,
        pose_chunks=data.pose.chunks,
        pose_compat=data.pose.compat,
        longrecipe_compat=data.longrecipe.compat,
        ends_sentence=ends_sentence,
    )
