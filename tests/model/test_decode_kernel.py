"""The decoding kernel (model/decode_kernel.py): the union softmax of every pass in one launch.

On CPU the kernel runs through Triton's interpreter in a child process
(tests/model/decode_kernel_interpreted.py, ~25 s): against a float64 union reference, and
inside the model against the eager CPU path (the fused CPU kernel and the log-sum-exp
merge). On CUDA (`gpu`): the compiled kernel against the reference at a 32K cache, and
replayed as a CUDA graph."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from longctx.model import decode_kernel
from tests.model.decode_kernel_interpreted import KERNEL_CASES, union_reference

ROOT = Path(__file__).resolve().parents[2]
KERNEL_TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
"""Error relative to the output's largest value: fp32 products and sums in another order;
fp16/bf16 add the weights' and the output's rounding (2^-11, 2^-8 relative)."""
MODEL_TOLERANCE = {"float32": 1e-5, "bfloat16": 3e-2}
"""Relative to the logits' range after two layers, the eager CPU path as reference."""


@pytest.fixture(scope="module")
def interpreted() -> dict[str, float]:
    pytest.importorskip("triton")
    env = os.environ | {"TRITON_INTERPRET": "1", "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"}
    done = subprocess.run(
        [sys.executable, "-m", "tests.model.decode_kernel_interpreted"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", list(KERNEL_CASES))
def test_the_kernel_is_the_softmax_over_the_union_of_the_passes(interpreted, case):
    """Random queries and masks over strided cache views; passes 1-3, GQA 1/4/8, a head
    dimension that is not a power of two, keys in two slices merged by the last program."""
    assert interpreted[case] <= KERNEL_TOLERANCE[KERNEL_CASES[case][-1]], interpreted[case]


def test_a_row_without_keys_is_zero_and_the_counters_reset(interpreted):
    """No key seen: zeros, not NaN. The arrival counters are zero after every launch, as
    a replayed CUDA graph needs them."""
    assert interpreted["a row that sees no key: zeros"] == 0
    assert interpreted["counters back to zero"] == 0


@pytest.mark.parametrize(
    "label", ["plain float32", "rope float32", "string float32", "string float32 fused", "string bfloat16 fused"]
)
def test_the_model_decodes_through_the_kernel_as_through_the_cpu_path(interpreted, label):
    """10 steps of 2 packed rows (a document starts during decoding): every attention call
    of a step went to the kernel (2 layers x 10 steps), none on the eager path, and the
    logits agree."""
    assert interpreted[f"kernel calls {label}"] == 20
    assert interpreted[f"kernel calls eager {label}"] == 0
    assert interpreted[f"model {label}"] <= MODEL_TOLERANCE[label.split()[1]], interpreted[f"model {label}"]


def test_the_kernel_runs_only_where_it_can():
    """CPU without the interpreter and fp64 keep the eager path."""
    if decode_kernel.interpreted():
        pytest.skip("TRITON_INTERPRET is set for this process")
    assert not decode_kernel.usable(torch.zeros(1, 1, 2, 16))
    assert not decode_kernel.usable(torch.zeros(1, 1, 2, 16, dtype=torch.float64, device="meta"))


def test_key_slices_fill_the_gpu_and_keep_enough_keys():
    """Batch 1, 4 key/value heads, a 32K cache: 66 slices wanted (264 programs), launched as 64 whole blocks of 512 keys;
    a short cache is one slice; batch 16 needs 5; at most MAX_SPLITS."""
    assert decode_kernel.splits_for(4, 32768) == 66
    assert decode_kernel.splits_for(4, 300) == 1
    assert decode_kernel.splits_for(16 * 4, 32768) == 5
    assert decode_kernel.splits_for(1, 10**7) == decode_kernel.MAX_SPLITS


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("arch", [90, 80])
def test_the_kernel_compiles_for_hopper_and_ampere(dtype, arch):
    """Triton compiles the kernel ahead of time for sm_90 / sm_80 without a GPU (through
    ptxas): tinyllama's decoding shapes, StRing's two passes; the arrival counter is an
    acquire/release atomic in the PTX."""
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if decode_kernel.interpreted():
        pytest.skip("TRITON_INTERPRET is set for this process")
    kernel = decode_kernel._kernel()
    constants = dict(KV_HEADS=4, GROUP=8, PASSES=2, DIM=64, BLOCK_G=16, BLOCK_D=64, BLOCK_N=decode_kernel.BLOCK_N)
    constants |= dict(PRECISION="ieee" if dtype == "fp32" else "tf32", UPCAST=False)
    pointers = dict(Q=dtype, K=dtype, V=dtype, A="u8", OUT=dtype, ACC="fp32", ML="fp32", COUNT="i32")
    signature = {
        name: "constexpr"
        if name in constants
        else f"*{pointers[name]}"
        if name in pointers
        else "fp32"
        if name == "scale"
        else "i32"
        for name in kernel.arg_names
    }
    source = ASTSource(
        fn=kernel, signature=signature, constexprs={(kernel.arg_names.index(n),): v for n, v in constants.items()}
    )
    compiled = triton.compile(source, target=GPUTarget("cuda", arch, 32))
    assert "atom.global.gpu.acq_rel.add" in compiled.asm["ptx"]
    assert compiled.asm.get("cubin")


def test_bad_shapes_are_named():
    q = torch.zeros(1, 2, 8, 16)
    k = torch.zeros(1, 30, 2, 16)
    with pytest.raises(ValueError, match=r"allowed \(1, 1, 30\)"):
        decode_kernel.decode_attend(q, k, k, torch.ones(1, 1, 30, dtype=torch.bool), 0.25)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_on_cuda_the_kernel_matches_the_reference_and_replays_as_a_graph(dtype):
    """tinyllama's heads (32 / 4, head dim 64), StRing's two passes over a 32K cache (64
    slices of 512 keys): the compiled kernel against float64; then recorded as a CUDA graph and
    replayed on new queries and masks, equal to an eager launch of them."""
    generator = torch.Generator(device="cuda").manual_seed(0)
    keys = 32768
    q = torch.randn(1, 2, 32, 64, device="cuda", generator=generator).to(dtype)
    k, v = (torch.randn(1, keys, 4, 64, device="cuda", generator=generator).to(dtype) for _ in range(2))
    allowed = torch.rand(1, 2, keys, device="cuda", generator=generator) < 0.5
    expected = union_reference(q, k, v, allowed, 0.125)
    got = decode_kernel.decode_attend(q, k, v, allowed, 0.125)
    assert ((got.double() - expected).abs().max() / expected.abs().max()).item() <= KERNEL_TOLERANCE[dtype]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        recorded = decode_kernel.decode_attend(q, k, v, allowed, 0.125)
    q.copy_(torch.randn(q.shape, device="cuda", generator=generator))
    allowed.copy_(torch.rand(allowed.shape, device="cuda", generator=generator) < 0.3)
    graph.replay()
    replayed = recorded.clone()  # the output buffer is shared: copy before the next launch
    assert torch.equal(replayed, decode_kernel.decode_attend(q, k, v, allowed, 0.125))


def test_with_the_kernel_a_string_layer_costs_what_a_rope_layer_costs(monkeypatch):
    """The kernel takes the passes' queries and masks as they are: per added layer, a
    StRing step dispatches exactly RoPE's operations (the CPU path adds the merge: softmax,
    product and sum in float32, two casts more in bf16).
    The launch itself is stubbed (not counted): only what surrounds it is."""
    from tests.model.test_decode_step import counted_step, model_and_method

    def per_layer(name: str) -> float:
        two, four = (sum(counted_step(*model_and_method(name, layers, fused=True)).ops.values()) for layers in (2, 4))
        return (four - two) / 2

    eager = {name: per_layer(name) for name in ("rope", "string")}
    monkeypatch.setattr(decode_kernel, "usable", lambda queries: True)
    monkeypatch.setattr(decode_kernel, "launch", lambda *args: None)
    kernel = {name: per_layer(name) for name in ("rope", "string")}
    assert kernel["string"] == kernel["rope"], kernel
    assert eager["string"] >= eager["rope"] + 3, eager
