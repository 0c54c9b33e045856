"""The processes an evaluation runs on, and the one rule that shares its work among them.

    torchrun --nproc_per_node=8 --nnodes=2 ... -m longctx eval-suite CKPT --suite ruler ...

Under torchrun every command of the evaluation engine (eval-suite, niah-table, niah) is
one rank of a process group: `Ranks.from_environment` reads torchrun's RANK, WORLD_SIZE,
LOCAL_RANK and LOCAL_WORLD_SIZE, joins the group (nccl on CUDA, each rank on
cuda:LOCAL_RANK; gloo on CPU) and returns this rank's place. Without torchrun it is the one
process of a world of one, with no group and no collective.

The rule (`share`, the one place work is dealt): a grid of n cells over W workers runs its
first W * floor(n / W) cells whole, cell i on worker i mod W, each worker on its own cells
without waiting for the others; the remaining n mod W cells (all of them when there are
fewer cells than workers) run one after another on every worker, the cell's pending
batches dealt the same way, batch j on worker j mod W. A worker is one rank, or, for a
model sharded over a node's ranks (eval/layout.py), those ranks together: they decode the
same batches, each forward a collective, and one of them writes. A batch is a fixed block of sample indices
(eval/cells.py), so what a rank decodes changes with W but how each sample is decoded does
not. The deal depends only on the grid and the records on disk (read by every rank after
the same barrier), never on timing, so every rank computes the same deal without asking.

Errors: every step that could fail on one rank and not the others ends with `settle`, so
all ranks stop together (no rank left waiting at a collective) with the failing rank named.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import socket
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from longctx.errors import LongctxError

T = TypeVar("T")
WAIT = datetime.timedelta(days=7)
"""How long a collective waits for the other ranks: a rank that has run its whole cells
waits at the grid's gather for the slowest rank, which can take hours (torch's default, 30
minutes for gloo, would end the run there). A rank that dies does not leave the others
waiting this long: torchrun stops every rank of a group when one fails."""


class RankError(LongctxError):
    """Another rank failed, or the ranks disagree: the message names the rank and the fix."""


@dataclass(frozen=True)
class Ranks:
    """This process's place among the evaluation's ranks (or among the ranks of one team:
    `replica`)."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    local_world: int = 1
    shard: int = 1
    """Ranks that hold one model together (eval/layout.py): 1 = every rank a whole model;
    a node's ranks when its weights are sharded over them. They decode the same batches."""
    group: Any = field(default=None, compare=False)
    """The process group of the collectives (None: the default group, every rank)."""
    replica_group: Any = field(default=None, compare=False)
    """The process group of this rank's replica (with shard > 1)."""

    @property
    def lead(self) -> bool:
        """Rank 0: it merges spread cells, writes tables and logs to W&B."""
        return self.rank == 0

    @property
    def worker(self) -> int:
        """Which model replica this rank belongs to: the unit the rule deals work to."""
        return self.rank // self.shard

    @property
    def workers(self) -> int:
        return self.world // self.shard

    @property
    def writer(self) -> bool:
        """The rank of its replica that writes the replica's records (the others decode the
        same batches, each forward a collective over the shards, and keep nothing)."""
        return self.rank % self.shard == 0

    def replica(self) -> Ranks:
        """The team that runs a whole cell: this rank alone, or, for a sharded model, the
        ranks of its replica."""
        if self.shard == 1:
            return Ranks()
        return Ranks(
            self.rank % self.shard, self.shard, self.local_rank, self.local_world, self.shard, self.replica_group
        )

    @classmethod
    def current(cls) -> Ranks:
        """The initialised process group's ranks (torchrun's local ranks from the
        environment), else one process."""
        if not (dist.is_available() and dist.is_initialized()):
            return cls()
        return cls(
            dist.get_rank(),
            dist.get_world_size(),
            int(os.environ.get("LOCAL_RANK", "0")),
            int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        )

    @classmethod
    @contextlib.contextmanager
    def joined(cls, device: torch.device) -> Iterator[Ranks]:
        """Join torchrun's process group when WORLD_SIZE > 1 (nccl for a CUDA `device`, each
        rank on cuda:LOCAL_RANK; gloo otherwise) and leave it afterwards; one process
        without torchrun."""
        created = int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized()
        if created:
            if device.type == "cuda":
                torch.cuda.set_device(device)
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo", timeout=WAIT)
        try:
            yield cls.current()
        finally:
            if created:
                dist.destroy_process_group()

    def layout(self, cells: int) -> str:
        """How a grid of `cells` is dealt (the module's rule), in words, for the log."""
        whole = whole_cells(cells, self)
        nodes = max(1, self.world // max(1, self.local_world))
        unit = "rank" if self.shard == 1 else f"replica (a model sharded over {self.shard} ranks)"
        return (
            f"{self.world} ranks ({nodes} node(s) x {self.local_world}), {self.workers} x one {unit}: {cells} "
            f"cells, {whole} run whole (cell i on worker i mod {self.workers}), {cells - whole} spread over "
            "every worker by batches"
        )

    def gather(self, value: T) -> list[T]:
        """Every rank's `value`, in rank order, on every rank (one process: [value])."""
        if self.world == 1:
            return [value]
        values: list[Any] = [None] * self.world
        dist.all_gather_object(values, value, group=self.group)
        return values

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier(group=self.group)

    def settle(self, error: BaseException | None) -> None:
        """A collective: raise on every rank when any rank failed. The failing rank raises its
        own error; the others a RankError naming the first failed rank and its message."""
        failures = [(rank, message) for rank, message in enumerate(self.gather(_describe(error))) if message]
        if error is not None:
            raise error
        if failures:
            rank, message = failures[0]
            raise RankError(f"rank {rank} of {self.world} failed: {message}")


def _describe(error: BaseException | None) -> str:
    return "" if error is None else f"{type(error).__name__}: {error}"


def share(items: list[T], ranks: Ranks) -> list[T]:
    """This rank's part of `items`: item j goes to worker j mod W (the module's rule; a
    worker is a rank, or the ranks that hold one sharded model together)."""
    return items[ranks.worker :: ranks.workers]


def whole_cells(cells: int, ranks: Ranks) -> int:
    """How many of a grid's first cells run whole, one worker each (the module's rule); the
    rest are spread over every worker by batches."""
    return cells - cells % ranks.workers


def check_shared_directory(root: str | Path, ranks: Ranks) -> None:
    """Refuse, on every rank, a cells directory some rank cannot see: rank 0 writes a marker
    file under `root`, every rank looks for it. Records of one rank would be invisible to
    the merge and to a resume on another, so the grid must not start."""
    if ranks.world == 1:
        return
    root = Path(root)
    marker = root / f".ranks-{ranks.gather(uuid.uuid4().hex)[0]}"
    error: Exception | None = None
    if ranks.lead:
        try:
            root.mkdir(parents=True, exist_ok=True)
            marker.write_text(f"written by rank 0 on {socket.gethostname()}\n")
        except OSError as failed:
            error = failed
    ranks.settle(error)
    seen = ranks.gather(marker.is_file())
    ranks.barrier()
    if ranks.lead:
        marker.unlink(missing_ok=True)
    hosts = ranks.gather(socket.gethostname())
    blind = [rank for rank, saw in enumerate(seen) if not saw]
    if blind:
        rank = blind[0]
        raise RankError(
            f"rank {rank} (host {hosts[rank]}) cannot see the cells directory {root}: rank 0 wrote {marker} "
            f"there and rank {rank} does not find it; give every rank the same path on a filesystem every "
            "node mounts (--cells, or eval.out_dir)"
        )


def check_same_models(fingerprints: dict[str, str], root: str | Path, ranks: Ranks) -> None:
    """Refuse, on every rank, models whose fingerprints (eval/cells.py `model_fingerprint`)
    differ from rank 0's: the ranks would write one table from different weights."""
    everyone = ranks.gather(fingerprints)
    for rank, theirs in enumerate(everyone):
        for name, fingerprint in everyone[0].items():
            if theirs.get(name) != fingerprint:
                raise RankError(
                    f"rank {rank} loaded other weights for model {name!r} than rank 0 (fingerprint "
                    f"{theirs.get(name)} vs {fingerprint}); its cells under {Path(root) / name} would mix them: "
                    "give every rank the same checkpoint (the same file on every node)"
                )
