"""The training step on CUDA makes no host synchronisation (issue 24, item 5), and the
memory estimate bounds the measured peak (`make test-gpu`; skipped without CUDA).

The steps are driven as Lightning's automatic optimisation drives them (micro-batches of
`training_step` + backward, then the module's gradient rescale, clipping and fused AdamW)
under `torch.cuda.set_sync_debug_mode("error")`: any blocking copy or device read raises.
Lightning's own logging (a float logged becomes a device tensor; the progress bar reads
metrics back) reads once per optimizer step and is outside this check.
"""

import warnings
from pathlib import Path

import pytest
import torch

from longctx.config import load
from longctx.data.packing import IGNORE_INDEX
from longctx.train.memory import estimate_memory
from longctx.train.module import LanguageModelModule, rescale_gradients

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda")
MICRO_BATCHES = 3
STEPS = 3


def host_batches(vocab: int, rows: int, window: int, count: int) -> list[dict[str, torch.Tensor]]:
    """Pinned host rows of three documents each, as the DataLoader hands them over."""
    generator = torch.Generator().manual_seed(0)
    batches = []
    for _ in range(count):
        ids = torch.randint(0, vocab, (rows, window + 1), generator=generator)
        documents = torch.zeros(rows, window, dtype=torch.long)
        documents[:, window // 3 :] = 1
        documents[:, 2 * window // 3 :] = 2
        start = torch.where(documents[:, 1:] != documents[:, :-1], torch.arange(1, window), 0)
        start = torch.nn.functional.pad(start, (1, 0)).cummax(dim=1).values
        labels = ids[:, 1:].clone()
        labels[:, :7] = IGNORE_INDEX
        batch = {
            "input_ids": ids[:, :-1],
            "labels": labels,
            "position_ids": torch.arange(window) - start,
            "document_ids": documents,
        }
        batches.append({key: value.contiguous().pin_memory() for key, value in batch.items()})
    return batches


def run_steps(backend: str, mode: str = "error") -> list[float]:
    config = load(
        [],
        [
            "model.preset=tiny",
            f"model.attention_backend={backend}",
            "data.window=512",
            "train.micro_batch_size=2",
            "train.global_batch_tokens=3072",
            "train.loss_chunk_tokens=256",
        ],
    )
    module = LanguageModelModule(config)
    module.configure_model()
    module.to(CUDA)
    optimizer = torch.optim.AdamW(module.parameters(), lr=1e-3, fused=True)
    parameters = list(module.parameters())
    batches = host_batches(config.model.vocab_size, 2, 512, MICRO_BATCHES * STEPS)
    losses = []
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode(mode)
    try:
        for step in range(STEPS):
            for index in range(MICRO_BATCHES):
                host = batches[step * MICRO_BATCHES + index]
                batch = {key: value.to(CUDA, non_blocking=True) for key, value in host.items()}
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = module.training_step(batch, index)
                module.nonfinite.observe_loss(loss / MICRO_BATCHES)  # as on_before_backward does
                (loss / MICRO_BATCHES).backward()
            loss_sum, labelled, capacity = module._step_totals.unbind()
            rescale_gradients(parameters, capacity, labelled)
            norm = torch.nn.utils.clip_grad_norm_(parameters, max_norm=1.0)
            module.nonfinite.before_update(optimizer, norm, step + 1)  # the non-finite guard, on the device
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(loss_sum / labelled)
            module._step_totals = None
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return [float(loss) for loss in losses]


def test_training_steps_make_no_host_sync():
    """Dense-mask attention (sdpa) needs no host value, so the whole step (transfer,
    forward, chunked loss, backward, rescale, clipping, the non-finite guard, AdamW) must run without one
    synchronising call; "error" mode raises at the first."""
    losses = run_steps("sdpa")
    assert all(torch.isfinite(torch.tensor(losses)))


ALLOWED_SYNC_FILES = {"attention.py", "flash.py", "batch.py"}
"""Where the varlen kernel's per-batch document lengths are read to the host (`max_seqlen`
is a host int; the segment count sizes `cu_seqlens`): model/attention.py, model/flash.py
and batch.py's `document_segments`. Moving that read to the loader is issue 24's
model-numerics half."""


def test_flash_steps_sync_only_where_the_kernel_needs_host_lengths():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        losses = run_steps("flash", mode="warn")
    assert all(torch.isfinite(torch.tensor(losses)))
    syncs = [w for w in caught if "synchroniz" in str(w.message)]
    places = {f"{Path(w.filename).name}:{w.lineno}" for w in syncs}
    assert {Path(w.filename).name for w in syncs} <= ALLOWED_SYNC_FILES, places


@pytest.mark.parametrize("checkpointing", [False, True])
def test_memory_estimate_bounds_the_measured_peak(checkpointing):
    """The estimate is an upper bound of `max_memory_allocated` over a bf16-mixed step of
    tinyllama-1.1b at T=2,048, within the stated margin (train/memory.py)."""
    config = load(
        [],
        [
            "model.preset=tinyllama-1.1b",
            "model.attention_backend=flash",
            "data.window=2048",
            "train.micro_batch_size=2",
            "train.global_batch_tokens=4096",
            "train.loss_chunk_tokens=2048",
            f"train.activation_checkpointing={checkpointing}",
        ],
    )
    torch.cuda.reset_peak_memory_stats()
    module = LanguageModelModule(config)
    module.configure_model()
    module.to(CUDA)
    optimizer = torch.optim.AdamW(module.parameters(), lr=1e-4, fused=True)
    batch = {key: value.to(CUDA) for key, value in host_batches(config.model.vocab_size, 2, 2048, 1)[0].items()}
    for _ in range(2):  # the second step holds the optimizer state
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = module.training_step(batch, 0)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    estimate = estimate_memory(config, world_size=1, precision="bf16-mixed", cuda=False)
    assert peak <= estimate.total <= 1.25 * peak, f"peak {peak / 2**30:.2f} GiB\n{estimate.table()}"
