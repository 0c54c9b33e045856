"""Small builders shared by tests."""

import torch


def packed_document_ids(lengths: list[int], batch: int = 1) -> torch.Tensor:
    """[batch, sum(lengths)] ids 0, 0, ..., 1, 1, ... for documents of the given lengths."""
    ids = torch.cat([torch.full((n,), i, dtype=torch.long) for i, n in enumerate(lengths)])
    return ids.expand(batch, -1).clone()


def reset_position_ids(lengths: list[int], batch: int = 1) -> torch.Tensor:
    """Positions restarting at 0 in every document."""
    ids = torch.cat([torch.arange(n) for n in lengths])
    return ids.expand(batch, -1).clone()
