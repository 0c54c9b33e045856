"""The training step on CUDA makes no host synchronisation but the one named (issue 24,
item 5; issue 31), and the memory estimate bounds the measured peak (`make test-gpu`;
skipped without CUDA). `make gpu-check` runs `run_steps` at tinyllama-1.1b on the flash
backend (benchmarks/gpu_check_correctness.py).

The steps are driven as Lightning's automatic optimisation drives them (micro-batches of
`training_step` + backward, then the module's gradient rescale, clipping and fused AdamW)
under `torch.cuda.set_sync_debug_mode("error")`: any blocking copy or device read raises.
The flash backend's one allowed synchronisation is batch.document_segments' `nonzero`
(the document count sizes cu_seqlens; batch.py says why it stays), run in "default" mode
inside `layout_sync_allowed` and nowhere else. (batch.py's other host read, `.cpu()` in
`check_batch`, is not on the training path: only tests call check_batch.) Lightning's own
logging (a float logged becomes a device tensor; the progress bar reads metrics back)
reads once per optimizer step and is outside this check.
"""

import contextlib
from collections.abc import Iterator

import pytest
import torch

from longctx.config import load
from longctx.data.packing import IGNORE_INDEX
from longctx.model import attention as attention_module
from longctx.train.memory import estimate_memory
from longctx.train.module import LanguageModelModule, rescale_gradients

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda")
MICRO_BATCHES = 3
STEPS = 3


def host_batches(vocab: int, rows: int, window: int, count: int, pin: bool = True) -> list[dict[str, torch.Tensor]]:
    """Host rows of three documents each, pinned as the DataLoader hands them over to CUDA."""
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
        batches.append({key: value.contiguous().pin_memory() if pin else value for key, value in batch.items()})
    return batches


@contextlib.contextmanager
def layout_sync_allowed() -> Iterator[None]:
    """The flash layout (attention._flash_cu_seqlens, whose document_segments' `nonzero`
    is the named synchronisation) runs in "default" sync-debug mode; all else keeps the
    mode set outside."""
    original = attention_module._flash_cu_seqlens

    def allowed(*args, **kwargs):
        mode = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode("default")
        try:
            return original(*args, **kwargs)
        finally:
            torch.cuda.set_sync_debug_mode(mode)

    attention_module._flash_cu_seqlens = allowed
    try:
        yield
    finally:
        attention_module._flash_cu_seqlens = original


def run_steps(
    backend: str,
    preset: str = "tiny",
    window: int = 512,
    rows: int = 2,
    micro_batches: int = MICRO_BATCHES,
    steps: int = STEPS,
    device: torch.device = CUDA,
) -> list[float]:
    """Losses of `steps` optimizer steps of `micro_batches` x `rows` x `window` tokens.
    On CUDA under sync-debug mode "error" (the flash layout's sync allowed); on CPU (the
    smoke of `make gpu-check`) the same steps without the mode, which CUDA alone has."""
    config = load(
        [],
        [
            f"model.preset={preset}",
            f"model.attention_backend={backend}",
            f"data.window={window}",
            f"train.micro_batch_size={rows}",
            f"train.global_batch_tokens={rows * window * micro_batches}",
            f"train.loss_chunk_tokens={window // 2}",
        ],
    )
    module = LanguageModelModule(config)
    with device:  # initialised where it runs: a 1.1B model's CPU initialisation takes seconds
        module.configure_model()
    module.to(device)
    cuda = device.type == "cuda"
    optimizer = torch.optim.AdamW(module.parameters(), lr=1e-3, fused=True)  # fused: reads the guard's found_inf
    parameters = list(module.parameters())
    batches = host_batches(config.model.vocab_size, rows, window, micro_batches * steps, pin=cuda)
    losses = []
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
    try:
        with layout_sync_allowed() if cuda else contextlib.nullcontext():
            for step in range(steps):
                for index in range(micro_batches):
                    host = batches[step * micro_batches + index]
                    batch = {key: value.to(device, non_blocking=True) for key, value in host.items()}
                    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
                        loss = module.training_step(batch, index)
                    module.nonfinite.observe_loss(loss / micro_batches)  # as on_before_backward does
                    (loss / micro_batches).backward()
                loss_sum, labelled, capacity = module._step_totals.unbind()
                rescale_gradients(parameters, capacity, labelled)
                norm = torch.nn.utils.clip_grad_norm_(parameters, max_norm=1.0)
                module.nonfinite.before_update(optimizer, norm, step + 1)  # the non-finite guard, on the device
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                losses.append(loss_sum / labelled)
                module._step_totals = None
    finally:
        if cuda:
            torch.cuda.set_sync_debug_mode("default")
    return [float(loss) for loss in losses]


def test_training_steps_make_no_host_sync():
    """Dense-mask attention (sdpa) needs no host value, so the whole step (transfer,
    forward, chunked loss, backward, rescale, clipping, the non-finite guard, AdamW) must run without one
    synchronising call; "error" mode raises at the first."""
    losses = run_steps("sdpa")
    assert all(torch.isfinite(torch.tensor(losses)))


def test_flash_steps_sync_only_in_the_named_layout_read():
    """The flash backend in "error" mode but for the named document_segments read."""
    losses = run_steps("flash")
    assert all(torch.isfinite(torch.tensor(losses)))


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
