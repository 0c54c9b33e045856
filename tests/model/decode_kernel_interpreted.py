"""The decoding kernel (model/inference/kernel.py) run on CPU through Triton's interpreter.

    TRITON_INTERPRET=1 PYTHONPATH=src python -m tests.model.decode_kernel_interpreted

Triton reads TRITON_INTERPRET when it is imported, so tests/model/test_decode_kernel.py
runs this module in a child process and asserts on the one JSON object it prints: for each
check, the worst error against its reference (and how often the kernel ran).
"""

from __future__ import annotations

import json
import os

import torch

from longctx.model.inference import kernel as decode_kernel
from tests.model.test_decode_step import model_and_method


def union_reference(q, k, v, allowed, scale):
    """float64: one softmax over every (pass, key) a row's passes see, GQA by repetition."""
    group = q.shape[2] // k.shape[2]
    keys, values = (x.double().repeat_interleave(group, dim=2) for x in (k, v))
    scores = torch.einsum("bphd,bthd->bhpt", q.double(), keys) * scale
    scores = scores.masked_fill(~allowed[:, None], float("-inf"))
    weights = torch.softmax(scores.flatten(2), dim=-1).view_as(scores).sum(dim=2)
    return torch.einsum("bht,bthd->bhd", weights, values)[:, None]


KERNEL_CASES = {
    # name: (batch, passes, heads, kv heads, head dim, keys, dtype)
    "one pass, MHA, fp32": (1, 1, 4, 4, 16, 70, torch.float32),
    "StRing's two passes, GQA 4, fp32": (2, 2, 8, 2, 16, 300, torch.float32),
    "three passes, head dim 20, two key slices, fp32": (3, 3, 6, 2, 20, 600, torch.float32),
    "two passes, GQA 8, fp16": (1, 2, 16, 2, 32, 520, torch.float16),
    "two passes, GQA 8, bf16": (1, 2, 16, 2, 32, 520, torch.bfloat16),
}


def kernel_checks() -> dict[str, float]:
    """Random queries, cache views (k/v a prefix of a longer buffer, so strided), random
    masks; the error relative to the reference's largest value."""
    results = {}
    generator = torch.Generator().manual_seed(0)
    buffers = decode_kernel.KernelBuffers()
    for name, (batch, passes, heads, kv_heads, dim, keys, dtype) in KERNEL_CASES.items():
        q = torch.randn(batch, passes, heads, dim, generator=generator).to(dtype)
        cache = torch.randn(2, batch, keys + 7, kv_heads, dim, generator=generator).to(dtype)
        k, v = cache[0, :, :keys], cache[1, :, :keys]
        allowed = torch.rand(batch, passes, keys, generator=generator) < 0.4
        expected = union_reference(q, k, v, allowed, dim**-0.5)
        got = decode_kernel.decode_attend(q, k, v, allowed, dim**-0.5, buffers).clone()
        results[name] = ((got.double() - expected).abs().max() / expected.abs().max()).item()
    q = torch.randn(1, 2, 4, 16, generator=generator)
    k = torch.randn(1, 40, 2, 16, generator=generator)
    blind = torch.zeros(1, 2, 40, dtype=torch.bool)
    blind_out = decode_kernel.decode_attend(q, k, k, blind, 0.25, buffers)
    results["a row that sees no key: zeros"] = blind_out.abs().max().item()
    counters = [t for t in buffers.workspaces.values() if t.dtype == torch.int32]
    results["counters back to zero"] = float(sum(int(c.abs().sum()) for c in counters)) if counters else -1.0
    return results


def decoded(name: str, kernel: bool, dtype: torch.dtype, fused: bool = False) -> tuple[torch.Tensor, int]:
    """Stepwise logits of 10 decoding steps after a packed prompt (a document starting
    during decoding in row 1), with the kernel (a cache that opts in) or the eager CPU
    path; kernel calls."""
    model, method = model_and_method(name, fused=fused)
    model = model.to(dtype)
    calls = 0
    attend = decode_kernel.decode_attend

    def counted(*args):
        nonlocal calls
        calls += 1
        return attend(*args)

    decode_kernel.decode_attend = counted
    try:
        ids = torch.randint(0, model.config.vocab_size, (2, 40), generator=torch.Generator().manual_seed(2))
        documents = torch.zeros(2, 40, dtype=torch.long)
        documents[0, 12:], documents[1, 34:] = 1, 1
        cache = model.new_kv_cache(2, 40, decode_kernel=kernel)
        steps = []
        with torch.no_grad():
            model(ids[:, :30], document_ids=documents[:, :30], kv_cache=cache, position_method=method)
            for t in range(30, 40):
                part = slice(t, t + 1)
                steps.append(
                    model(ids[:, part], document_ids=documents[:, part], kv_cache=cache, position_method=method)
                )
    finally:
        decode_kernel.decode_attend = attend
    return torch.cat(steps, dim=1).double(), calls


def model_checks() -> dict[str, float]:
    """The model's decoding with the kernel against the eager CPU path (fused CPU kernel
    and log-sum-exp merge): error relative to the logits' range; and the kernel's calls."""
    results = {}
    for name, dtype, fused in [
        ("plain", torch.float32, False),
        ("rope", torch.float32, False),
        ("string", torch.float32, False),
        ("string", torch.float32, True),
        ("string", torch.bfloat16, True),
    ]:
        label = f"{name} {str(dtype).removeprefix('torch.')}{' fused' if fused else ''}"
        got, calls = decoded(name, True, dtype, fused)
        expected, eager_calls = decoded(name, False, dtype, fused)
        results[f"model {label}"] = ((got - expected).abs().max() / expected.abs().max()).item()
        results[f"kernel calls {label}"] = float(calls)
        results[f"kernel calls eager {label}"] = float(eager_calls)
    return results


def main() -> None:
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit("run with TRITON_INTERPRET=1 (module docstring)")
    print(json.dumps(kernel_checks() | model_checks()))


if __name__ == "__main__":
    main()
