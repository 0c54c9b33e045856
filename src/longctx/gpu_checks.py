"""The GPU path's numerical checks, each against an independent reference, shared by the
`gpu` tests (small sizes, `make test-gpu`) and `make gpu-check`'s correctness part
(tools/gpu/gpu_check_correctness.py, the GPU-scale sizes). Each check raises
AssertionError naming what differs, and returns what it measured.

- `assert_backend_matches_fp32_sdpa`: a packed-varlen backend (flash, xformers) in bf16
  against the dense-mask sdpa reference in fp32, output and q/k/v gradients;
- `assert_band_pass_gradients_match_fp64_path`: a multi-pass position method (StRing,
  ReRoPE, Self-Extend, DCA; STRING §3-4) on the flash path against its pure-torch path in
  fp64 (exact autograd), through the lse merge's backward;
- `assert_bf16_true_rope_matches_float64`: a bf16 model's RoPE cos/sin against float64;
- `assert_hf_functions_match_longctx`: longctx.hf_attention's functions in a transformers
  Llama against longctx's own model on the same weights;
- `run_steps`: optimizer steps driven as Lightning drives them, on CUDA under
  `torch.cuda.set_sync_debug_mode("error")` (the flash layout's one synchronisation allowed);
- `kill_and_resume_losses`: `longctx pretrain` SIGKILLed mid-run and resumed from its last
  checkpoint, the losses of both runs side by side.

Every check takes its device: on CPU the same code runs at tiny sizes (the checks' own
tests and the smoke of `make gpu-check`), where CUDA-only settings (sync-debug mode, fsdp,
compile, bf16) are off. No test doubles live here: a caller that wants backend `flash` on
CPU installs the kernel's stand-in itself (tests/model/varlen_stand_in.py).
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from longctx.config import load
from longctx.config.model import ModelConfig
from longctx.data.packing import IGNORE_INDEX
from longctx.model import attention as attention_module
from longctx.model.attention import attention
from longctx.model.llama import Llama
from longctx.model.position_methods import PositionMethod
from longctx.train.module import LanguageModelModule, rescale_gradients

CUDA = torch.device("cuda")
CPU = torch.device("cpu")


def packed_rows(lengths: list[int], total: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(position_ids, document_ids) [2, total]: row 0 packs documents of `lengths` (positions
    restart at 0 in each), row 1 is one document of `total` tokens."""
    if sum(lengths) != total:
        raise ValueError(f"document lengths {lengths} add up to {sum(lengths)}, not {total}")
    documents = torch.cat([torch.full((n,), i, dtype=torch.long) for i, n in enumerate(lengths)])
    positions = torch.cat([torch.arange(n) for n in lengths])
    return torch.stack([positions, torch.arange(total)]), torch.stack([documents, torch.zeros(total, dtype=torch.long)])


def document_rows(total: int, device: torch.device = CUDA) -> torch.Tensor:
    """document_ids [2, total]. Row 0: four packed documents (one of a single token); row 1: one."""
    lengths = [total // 4, 1, total // 2, total - total // 4 - total // 2 - 1]
    return packed_rows(lengths, total)[1].to(device)


def random_qkv(
    rows: int, q_len: int, kv_len: int, heads: int, kv_heads: int, dim: int, dtype: torch.dtype = torch.float64
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Standard normal q [rows, q_len, heads, dim], k/v [rows, kv_len, kv_heads, dim] on the CPU."""
    q = torch.randn(rows, q_len, heads, dim, dtype=dtype)
    k = torch.randn(rows, kv_len, kv_heads, dim, dtype=dtype)
    v = torch.randn(rows, kv_len, kv_heads, dim, dtype=dtype)
    return q, k, v


def relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    """||got - expected|| / ||expected|| (L2 over all entries), in float64 on the CPU."""
    return ((got.double().cpu() - expected).norm() / expected.norm()).item()


# --- attention ----------------------------------------------------------------------------


def assert_backend_matches_fp32_sdpa(backend: str, total: int, device: torch.device = CUDA) -> float:
    """`backend` in bf16 on 2 rows of `total` tokens (packed documents, GQA 8/2 heads of 64)
    against the fp32 dense-mask sdpa reference: output within 2e-2, q/k/v gradients within
    5% of each gradient's largest entry (bf16 keeps 8 mantissa bits; the gradients sum
    `total` terms). Returns the largest error relative to its bound."""
    docs = document_rows(total, device)
    inputs = [t.to(device) for t in random_qkv(2, total, total, heads=8, kv_heads=2, dim=64, dtype=torch.bfloat16)]
    grad_out = torch.randn(2, total, 8, 64, device=device)
    results = {}
    for name, dtype in ((backend, torch.bfloat16), ("sdpa", torch.float32)):
        q, k, v = (t.to(dtype).requires_grad_() for t in inputs)
        out = attention(q, k, v, document_ids=docs, backend=name)
        results[name] = (out.detach(), *torch.autograd.grad(out, (q, k, v), grad_out.to(dtype)))
    worst = 0.0
    for index, (got, expected) in enumerate(zip(results[backend], results["sdpa"], strict=True)):
        bound = 2e-2 if index == 0 else 5e-2 * expected.abs().max().item()
        torch.testing.assert_close(got.float(), expected, atol=bound, rtol=0)
        worst = max(worst, (got.float() - expected).abs().max().item() / bound)
    return worst


def assert_band_pass_gradients_match_fp64_path(
    method_factory: Callable[[], PositionMethod],
    positions: torch.Tensor,
    docs: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    device: torch.device,
    reference_device: torch.device = CPU,
    dtype: torch.dtype = torch.bfloat16,
    backend: str = "flash",
) -> float:
    """The method (a fresh one from `method_factory` for each side) in `dtype` on `device`'s
    `backend` path against its pure-torch path in fp64 on `reference_device` (exact
    autograd, checked against the dense Eq. 4 reference in tests/model/test_flash.py):
    output and q/k/v gradients through the merged passes (the lse merge's backward),
    relative L2 error of each below 3e-2 in bf16 (8 mantissa bits, ~4e-3 per rounding),
    1e-5 otherwise. Returns the largest error."""
    bound = 3e-2 if dtype == torch.bfloat16 else 1e-5
    q, k, v = (t.detach().to(reference_device, torch.float64).requires_grad_() for t in (q, k, v))
    weights = torch.randn(*q.shape[:3], q.shape[-1], dtype=torch.float64, device=reference_device)
    reference_rows = [t.to(reference_device) for t in (positions, docs)]
    expected = (
        method_factory()
        .to(reference_device)
        .attend(q, k, v, position_ids=reference_rows[0], document_ids=reference_rows[1])
    )
    expected_grads = torch.autograd.grad((expected * weights).sum(), (q, k, v))
    method = method_factory().to(device)
    leaves = [t.detach().to(device, dtype).requires_grad_() for t in (q, k, v)]
    got = method.attend(*leaves, position_ids=positions.to(device), document_ids=docs.to(device), backend=backend)
    got_grads = torch.autograd.grad((got.double() * weights.to(device)).sum(), leaves)
    expected_cpu = [t.detach().cpu() for t in (expected, *expected_grads)]
    errors = [relative_error(g.detach(), e) for g, e in zip((got, *got_grads), expected_cpu, strict=True)]
    assert max(errors) < bound, f"relative errors (out, dq, dk, dv) {[f'{e:.2e}' for e in errors]} >= {bound}"
    return max(errors)


def assert_bf16_true_rope_matches_float64(device: torch.device) -> None:
    """cos/sin of a bf16 debug model at positions up to 131,071 on `device` within
    m theta 2^-23 + 4e-6 of float64: the angles are formed in float32 (2^-23 relative) even
    when the model is bf16 (the CPU suite's bound, tests/model/test_rope.py)."""
    config = ModelConfig.from_preset("debug", max_position=131072)
    model = Llama(config).to(device, torch.bfloat16)
    positions = torch.tensor([[0, 2047, 32767, 131071]], device=device)
    cos, sin = model.rope(positions, torch.bfloat16)
    dim = config.head_size
    theta = 1.0 / config.rope_base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    angles = positions.cpu().double()[..., None] * theta
    angles = torch.cat([angles, angles], dim=-1)
    bound = angles * 2.0**-23 * 1.01 + 4e-6
    assert ((cos.cpu().double() - angles.cos()).abs() <= bound).all(), "cos beyond m theta 2^-23 + 4e-6"
    assert ((sin.cpu().double() - angles.sin()).abs() <= bound).all(), "sin beyond m theta 2^-23 + 4e-6"


# --- training steps without host synchronisation ------------------------------------------


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
    """The flash layout (attention._flash_cu_seqlens, whose batch.document_segments' `nonzero`
    sizes cu_seqlens: the one named synchronisation, batch.py says why it stays) runs in
    "default" sync-debug mode; all else keeps the mode set outside."""
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
    micro_batches: int = 3,
    steps: int = 3,
    device: torch.device = CUDA,
) -> list[float]:
    """Losses of `steps` optimizer steps of `micro_batches` x `rows` x `window` tokens, driven
    as Lightning's automatic optimisation drives them (micro-batches of `training_step` +
    backward, the module's gradient rescale, clipping, the non-finite guard, fused AdamW).
    On CUDA under sync-debug mode "error", so any blocking copy or device read raises (the
    flash layout's sync allowed); on CPU the same steps without the mode, which CUDA alone has."""
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
                assert module._step_totals is not None
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


# --- kill and resume ----------------------------------------------------------------------

RESUME_TOLERANCE = 2e-2
"""Losses of a resumed run vs the uninterrupted one (absolute): flash backward (atomic adds)
and compiled kernels are not bitwise deterministic on CUDA."""
CHECKPOINT_EVERY = 5


def prepared_workspace(root: Path) -> Path:
    """A small prose corpus (120 embedded documents), a 512-token BPE trained on it, and the
    prepared dataset under `root`: what a pretrain of the debug preset reads."""
    from longctx.data.corpus import embedded_documents
    from longctx.data.prepare import prepare
    from longctx.data.tokenizer import train_bpe

    texts = [doc.text for doc in itertools.islice(embedded_documents(("prose",)), 120)]
    root.mkdir(parents=True, exist_ok=True)
    corpus = root / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    train_bpe(texts, vocab_size=512, path=root / "tokenizer.json")
    prepare(str(corpus), root / "data", str(root / "tokenizer.json"), verbose=False)
    return root


def pretrain_arguments(workspace: Path, out_dir: Path, cuda: bool, max_steps: int) -> list[str]:
    """The debug preset at 64 tokens on `workspace`, a checkpoint every CHECKPOINT_EVERY steps,
    rows from two loader workers (resume must restore them exactly); on CUDA with fsdp,
    compile, bf16-mixed and the automatic backend (flash), on CPU with varlen."""
    values: dict[str, object] = {
        "model.preset": "debug",
        "model.vocab_size": 512,
        "model.max_position": 64,
        "model.attention_backend": "auto" if cuda else "varlen",
        "data.path": workspace / "data",
        "data.tokenizer": workspace / "tokenizer.json",
        "data.window": 64,
        "train.micro_batch_size": 2,
        "train.global_batch_tokens": 512,
        "train.max_steps": max_steps,
        "train.warmup_steps": 2,
        "train.lr": 3e-3,
        "train.min_lr": 3e-4,
        "train.checkpoint_every_steps": CHECKPOINT_EVERY,
        "train.loader_workers": 2,
        "train.out_dir": out_dir,
        "log.wandb_mode": "disabled",  # the GPU image has no wandb
        "log.every_steps": 1,
        "probe.fi": "false",
    }
    if cuda:
        values |= {"train.precision": "bf16-mixed", "train.strategy": "fsdp", "train.compile": "true"}
    return [f"{key}={value}" for key, value in values.items()]


def launch_pretrain(arguments: list[str], log: Path) -> subprocess.Popen:
    """`longctx pretrain arguments`, its console in `log`, in a process group of its own
    (os.killpg stops it with its compile and loader workers) and killed by the kernel if this
    process dies first (Linux PR_SET_PDEATHSIG): a caller stopped at a time limit leaves no
    pretrain running on its own."""
    environment = dict(os.environ, WANDB_SILENT="true", PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    return subprocess.Popen(
        [sys.executable, "-m", "longctx", "pretrain", *arguments],
        env=environment,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=_die_with_parent,
    )


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the parent exits (prctl PR_SET_PDEATHSIG = 1)."""
    if sys.platform == "linux":
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def logged_losses(out_dir: Path) -> dict[int, float]:
    """{step: train/loss} a pretrain has logged to out_dir/metrics.jsonl so far (the probes'
    rows skipped); none while the file is missing or its last line half written."""
    try:
        lines = (out_dir / "metrics.jsonl").read_text().splitlines()
        rows = [json.loads(line) for line in lines]
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
    return {row["step"]: row["train/loss"] for row in rows if "train/loss" in row}


def kill_and_resume_losses(
    root: Path, cuda: bool = True, kill_after: int = 12, max_steps: int = 100, timeout_s: float = 900
) -> dict[int, tuple[float, float]]:
    """`longctx pretrain` of the debug preset (pretrain_arguments) killed (SIGKILL, its
    process group) once it has logged step `kill_after`, then resumed from its last
    checkpoint before that step and run to `max_steps`. Returns {step: (killed run's loss,
    resumed run's loss)} for the steps both ran after the checkpoint."""
    workspace = prepared_workspace(root / "workspace")
    first, second = root / "killed", root / "resumed"
    process = launch_pretrain(pretrain_arguments(workspace, first, cuda, max_steps), root / "killed.log")
    try:
        while process.poll() is None and max(logged_losses(first), default=0) < kill_after:
            time.sleep(0.05)
    finally:
        _stop(process)
    killed = logged_losses(first)
    assert max(killed, default=0) >= kill_after, (root / "killed.log").read_text()[-4000:]
    resume_step = (kill_after - 1) // CHECKPOINT_EVERY * CHECKPOINT_EVERY
    checkpoint = first / "checkpoints" / f"step-{resume_step:07d}.ckpt"
    assert checkpoint.exists(), sorted(p.name for p in (first / "checkpoints").iterdir())
    arguments = [*pretrain_arguments(workspace, second, cuda, max_steps), f"train.resume={checkpoint}"]
    process = launch_pretrain(arguments, root / "resumed.log")
    try:
        code = process.wait(timeout=timeout_s)
    finally:
        _stop(process)
    assert code == 0, (root / "resumed.log").read_text()[-4000:]
    resumed = logged_losses(second)
    return {step: (killed[step], resumed[step]) for step in sorted(killed) if step > resume_step}


# --- the position methods inside transformers models ---------------------------------------


def hf_arms() -> tuple[str, ...]:
    """Every attention method and every arm of one (string-repo): each runs as longctx_<name>."""
    from longctx.config.methods.registry import arm_names, arm_spec, method_names

    attention = method_names("passes")
    return attention + tuple(arm for arm in arm_names() if arm_spec(arm).method in attention)


HF_TRAINING_LENGTH = 2048
HF_BF16_BOUND = 3e-2
"""Relative L2 error of the logits in bf16: transformers rotates q/k with bf16 cos/sin,
longctx with float32 ones, and both round every activation to 8 mantissa bits (~4e-3 per
rounding, through 2 layers); float32: 1e-4."""


def assert_hf_functions_match_longctx(directory: Path, device: torch.device, tokens: int, dtype: torch.dtype) -> dict:
    """{arm: relative L2 error of the logits} of each `longctx_<method>` attention function
    in a random transformers Llama (2 layers, 8 heads / 4 KV of 32, training length 2,048,
    saved to `directory`) against longctx's own model on the same weights (its flash path
    on CUDA, its CPU kernels elsewhere), the methods at their defaults; each below the
    bound, AssertionError otherwise."""
    import transformers

    import longctx.hf_attention as hfa
    from longctx.config.methods.registry import arm_spec
    from longctx.config.position_methods import arm_config
    from longctx.model.hf import import_hf
    from longctx.model.position_methods import build_position_method

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=1024,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=4,
        max_position_embeddings=HF_TRAINING_LENGTH,
        initializer_range=0.1,
    )
    transformers.LlamaForCausalLM(config).save_pretrained(directory)
    model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=dtype)
    model = model.to(device).eval()  # type: ignore[arg-type]  # transformers' stubs type .to's argument as a model
    own = import_hf(directory, dtype=dtype, device=device).eval()
    ids = torch.randint(0, config.vocab_size, (1, tokens), device=device)
    bound = HF_BF16_BOUND if dtype == torch.bfloat16 else 1e-4
    errors = {}
    for arm in hf_arms():
        spec, settings = arm_spec(arm), arm_config(arm)
        hfa.apply(model, spec.method, **spec.params)
        with torch.no_grad():
            got = model(ids).logits
            expected = own(ids, position_method=build_position_method(settings, own.config))
        errors[arm] = relative_error(got, expected.double().cpu())
    worst = max(errors, key=lambda arm: errors[arm])
    assert errors[worst] < bound, f"{worst}: relative L2 error {errors[worst]:.2e} >= {bound} ({errors})"
    return errors
