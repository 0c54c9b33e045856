"""The training step on CUDA makes no host synchronisation but the one named, and the
memory estimate bounds the measured peak (`make test-gpu`; skipped without CUDA).
`make gpu-check` runs `run_steps` (longctx.gpu_checks) at tinyllama-1.1b on the flash
backend (tools/gpu/gpu_check_correctness.py).

The steps are driven as Lightning's automatic optimisation drives them (micro-batches of
`training_step` + backward, then the module's gradient rescale, clipping and fused AdamW)
under `torch.cuda.set_sync_debug_mode("error")`: any blocking copy or device read raises.
The flash backend's one allowed synchronisation is batch.document_segments' `nonzero`
(the document count sizes cu_seqlens; batch.py says why it stays), run in "default" mode
inside `layout_sync_allowed` and nowhere else. (batch.py's other host read, `.cpu()` in
`check_batch`, is not on the training path: only tests call check_batch.) Lightning's own
logging (a float logged becomes a device tensor; the progress bar reads metrics back)
reads once per optimizer step and is outside this check."""

import pytest
import torch

from longctx.config import load
from longctx.gpu_checks import host_batches, run_steps
from longctx.train.memory_budget import MARGIN, estimate_memory
from longctx.train.module import LanguageModelModule

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda")


def test_training_steps_make_no_host_sync():
    """Dense-mask attention (sdpa) needs no host value, so the whole step (transfer,
    forward, chunked loss, backward, rescale, clipping, the non-finite guard, AdamW) must run without one
    synchronising call; "error" mode raises at the first."""
    losses = run_steps("sdpa", device=CUDA)
    assert all(torch.isfinite(torch.tensor(losses)))


def test_flash_steps_sync_only_in_the_named_layout_read():
    """The flash backend in "error" mode but for the named document_segments read."""
    losses = run_steps("flash", device=CUDA)
    assert all(torch.isfinite(torch.tensor(losses)))


@pytest.mark.parametrize("checkpointing", [False, True])
def test_memory_estimate_bounds_the_measured_peak(checkpointing):
    """The estimate is an upper bound of `max_memory_allocated` over a bf16-mixed step of
    tinyllama-1.1b at T=2,048, within the stated margin (train/memory_budget.py); the
    gradients are set to None after each step, so none live through the next forward."""
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
    estimate = estimate_memory(config, 1, "bf16-mixed", cuda=False, gradients_freed_before_forward=True)
    assert peak <= estimate.total <= (1 + MARGIN) * peak, f"peak {peak / 2**30:.2f} GiB\n{estimate.table()}"
