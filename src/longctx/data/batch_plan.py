"""The batch plan: how a global batch in tokens becomes micro-batches, accumulation steps
and rows per optimizer step (STRING Appendix A.2: the same 4M tokens per step at 2K and 4K)."""

from __future__ import annotations

from longctx.errors import ConfigError


def tokens_per_step(window: int, micro_batch_size: int, world_size: int, global_batch_tokens: int) -> tuple[int, int]:
    """(gradient accumulation steps, rows per optimizer step) for a global batch in tokens.

    2K and 4K windows at the same `global_batch_tokens` consume the same tokens per step;
    the 4K run accumulates twice as many micro-batches (STRING A.2). A global batch that is
    not a whole number of micro-steps (window x micro-batch x world size tokens) is a
    `ConfigError` on `train.global_batch_tokens` naming the nearest valid values and the
    world sizes the configured batch does divide: training on more nodes than a config was
    written for is where this is met.
    """
    rows_per_micro_step = micro_batch_size * world_size
    tokens_per_micro_step = window * rows_per_micro_step
    if global_batch_tokens % tokens_per_micro_step:
        below = global_batch_tokens // tokens_per_micro_step * tokens_per_micro_step
        above = below + tokens_per_micro_step
        nearest = " or ".join(f"{value:,}" for value in (below, above) if value > 0)
        rows = (
            global_batch_tokens // (window * micro_batch_size)
            if global_batch_tokens % (window * micro_batch_size) == 0
            else 0
        )
        sizes = [size for size in range(1, min(rows, 4096) + 1) if rows % size == 0]
        fits = f"; as it is, it divides into world sizes {', '.join(map(str, sizes[:12]))}" if sizes else ""
        raise ConfigError(
            "train.global_batch_tokens",
            f"{global_batch_tokens:,} is not a multiple of data.window x train.micro_batch_size x world size = "
            f"{window} x {micro_batch_size} x {world_size} = {tokens_per_micro_step:,}; the nearest valid values are "
            f"{nearest} (or change train.micro_batch_size or the number of devices{fits})",
            ("data.window", "train.micro_batch_size"),
        )
    accumulation = global_batch_tokens // tokens_per_micro_step
    return accumulation, accumulation * rows_per_micro_step
