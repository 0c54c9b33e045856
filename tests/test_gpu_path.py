"""The GPU path end to end (`make test-gpu`; skipped without CUDA): every attention backend
against the sdpa reference (forward, backward, decoding, under autocast), every position
method's CUDA path against its CPU path, StRing prefill memory at 32K, a CUDA pretrain
killed mid-run and resumed, and a NIAH run on CUDA. Written against documented torch APIs so
they run on both the GPU image's torch 2.11 and the pinned 2.14."""

import json

import pytest
import torch

from longctx.cli import main
from longctx.config.model import ModelConfig
from longctx.config.position_methods import PositionMethodConfig
from longctx.gpu_checks import RESUME_TOLERANCE, assert_backend_matches_fp32_sdpa, document_rows, kill_and_resume_losses
from longctx.model.attention import attention, build_mask
from longctx.model.checkpoint import save_model
from longctx.model.llama import Llama
from longctx.model.position_methods import build_position_method
from tests.helpers import packed_document_ids, reset_position_ids
from tests.model.helpers import all_methods, decoding_step, random_qkv, two_rows

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda")
BACKENDS = ["flash", "flex", "xformers"]


def require(backend: str) -> None:
    if backend == "xformers":
        pytest.importorskip("xformers")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("q_len", [256, 9, 1], ids=["prefill", "chunk", "decode"])
def test_backend_matches_sdpa_forward(backend, q_len):
    require(backend)
    docs = document_rows(256)
    q, k, v = (t.to(CUDA) for t in random_qkv(2, q_len, 256, heads=8, kv_heads=2, dim=64, dtype=torch.bfloat16))
    expected = attention(q.float(), k.float(), v.float(), document_ids=docs, backend="sdpa")
    got = attention(q, k, v, document_ids=docs, backend=backend)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), expected, atol=2e-2, rtol=0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_backend_matches_sdpa_backward(backend):
    require(backend)
    assert_backend_matches_fp32_sdpa(backend, 256, CUDA)


@pytest.mark.parametrize("backend", ["sdpa", *BACKENDS])
@pytest.mark.parametrize("precision", ["bf16-mixed", "bf16-true"])
def test_model_trains_under_bf16_with_every_backend(backend, precision):
    """The dtype rule on CUDA: logits and gradients close to the fp32 sdpa run."""
    require(backend)
    torch.manual_seed(0)
    reference_model = Llama(ModelConfig.from_preset("debug", max_position=256, init_std=0.05)).to(CUDA)
    lengths = [100, 156]
    ids = torch.randint(0, 8192, (1, 256), device=CUDA)
    options = {
        "position_ids": reset_position_ids(lengths).to(CUDA),
        "document_ids": packed_document_ids(lengths).to(CUDA),
    }
    reference = reference_model(ids, attention_backend="sdpa", **options)
    reference.float().logsumexp(-1).mean().backward()
    model = Llama(reference_model.config).to(CUDA)
    model.load_state_dict(reference_model.state_dict())
    if precision == "bf16-true":
        model = model.to(torch.bfloat16)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision == "bf16-mixed"):
        logits = model(ids, attention_backend=backend, **options)
        logits.float().logsumexp(-1).mean().backward()
    scale = reference.abs().max().item()
    torch.testing.assert_close(logits.float(), reference, atol=5e-2 * scale, rtol=0)
    expected = reference_model.blocks[0].attn.wq.weight.grad
    got = model.blocks[0].attn.wq.weight.grad.float()
    torch.testing.assert_close(got, expected, atol=0.1 * expected.abs().max().item(), rtol=0)


def test_auto_is_flash_under_autocast_and_flex_in_fp32():
    docs = document_rows(64)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        assert build_mask(docs, 64, "auto", dtype=torch.float32).backend == "flash"
    assert build_mask(docs, 64, "auto", dtype=torch.float32).backend == "flex"


@pytest.mark.parametrize("name", list(all_methods()))
def test_position_method_cuda_path_matches_cpu_path(name):
    """Band methods run on the varlen kernel (backend flash), DCA on the torch kernels, the
    one-pass methods on `attention()`: all against the CPU fp64 path, prefill and decoding."""
    method = all_methods()[name]
    positions, docs = two_rows([19, 1, 16], 36)
    q, k, v = random_qkv(2, 36, 36)
    expected = method.attend(q, k, v, position_ids=positions, document_ids=docs)
    gpu_method = all_methods()[name].to(CUDA)
    cuda = [t.to(CUDA) for t in (positions, docs)]
    q16, k16, v16 = (t.to(CUDA, torch.bfloat16) for t in (q, k, v))
    got = gpu_method.attend(q16, k16, v16, position_ids=cuda[0], document_ids=cuda[1], backend="flash")
    torch.testing.assert_close(got.double().cpu(), expected, atol=3e-2, rtol=0)
    rotated = gpu_method.caches_rotated_keys
    cache = gpu_method.rotate_keys(k16, cuda[0]) if rotated else k16
    for t in (0, 9, 10, 20, 35):
        step = decoding_step(gpu_method, t, q16, cache, v16, *cuda, keys_rotated=rotated, backend="flash")
        reference = expected[:, t]
        if name == "string-repo":  # decodes over [0, S-1], not its prefill's [0, S]: the CPU path's step
            reference = decoding_step(method, t, q, k, v, positions, docs)
        torch.testing.assert_close(step.double().cpu(), reference, atol=3e-2, rtol=0)


@pytest.mark.slow
@torch.no_grad()
def test_string_prefill_at_32k_fits_in_linear_memory():
    """tinyllama-1.1b bf16, StRing prefill of 32K tokens into a KV cache: no [T, T]
    tensor, so the peak stays near weights + cache + a few [T, d_model] activations."""
    config = ModelConfig.from_preset("tinyllama-1.1b", vocab_size=8192, max_position=2048)
    model = Llama(config).to(CUDA, torch.bfloat16).eval()
    method = build_position_method(PositionMethodConfig(name="string"), config).to(CUDA)
    length = 32768
    ids = torch.randint(0, 8192, (1, length), device=CUDA)
    cache = model.new_kv_cache(1, length + 1)
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    logits = model(ids, kv_cache=cache, position_method=method, last_logits_only=True)
    assert torch.isfinite(logits).all()
    extra_gib = (torch.cuda.max_memory_allocated() - before) / 2**30
    assert extra_gib < 8, f"StRing prefill at 32K used {extra_gib:.1f} GiB above weights and cache"


@pytest.mark.slow
def test_pretrain_killed_mid_run_resumes_to_the_same_losses(tmp_path):
    pairs = kill_and_resume_losses(tmp_path)
    assert pairs
    for step, (expected, resumed) in pairs.items():
        assert resumed == pytest.approx(expected, abs=RESUME_TOLERANCE), f"step {step}"


def test_niah_runs_on_cuda_in_bf16_at_given_lengths(tmp_path):
    from longctx.data.corpus import embedded_documents

    haystack = tmp_path / "haystack.txt"
    haystack.write_text("\n".join(doc.text for _, doc in zip(range(30), embedded_documents(("prose",)), strict=False)))
    checkpoint = tmp_path / "model.safetensors"
    save_model(Llama(ModelConfig.from_preset("debug", max_position=256)), checkpoint)
    args = [
        f"eval.niah.haystack={haystack}",
        "eval.niah.tests_per_length=2",
        "eval.niah.max_new_tokens=8",
        "log.wandb_mode=disabled",
        "eval.device=cuda",
        "eval.position_method.name=string",
        "eval.position_method.string.shift_ratio=0.25",
        "eval.position_method.string.local_window=16",
    ]
    assert main(["niah", str(checkpoint), *args, "--lengths", "128,384", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "niah.json").read_text())
    assert result["lengths"] == [128, 384]
    assert [row["tests"] for row in result["per_length"]] == [2, 2]
