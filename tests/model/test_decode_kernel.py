"""The decoding kernel (model/inference/kernel.py): the union softmax of every pass in one launch.

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

from longctx.model.inference import kernel as decode_kernel
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
        decode_kernel.decode_attend(
            q, k, k, torch.ones(1, 1, 30, dtype=torch.bool), 0.25, decode_kernel.KernelBuffers()
        )


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
    buffers = decode_kernel.KernelBuffers()
    got = decode_kernel.decode_attend(q, k, v, allowed, 0.125, buffers)
    assert ((got.double() - expected).abs().max() / expected.abs().max()).item() <= KERNEL_TOLERANCE[dtype]
    graph, side = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # the warm-up on the capture's stream (torch's CUDA-graph notes)
        decode_kernel.decode_attend(q, k, v, allowed, 0.125, buffers)
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(graph, stream=side):
        recorded = decode_kernel.decode_attend(q, k, v, allowed, 0.125, buffers)
    q.copy_(torch.randn(q.shape, device="cuda", generator=generator))
    allowed.copy_(torch.rand(allowed.shape, device="cuda", generator=generator) < 0.3)
    graph.replay()
    eager = decode_kernel.decode_attend(q, k, v, allowed, 0.125, buffers)  # the default stream's buffers
    assert eager.data_ptr() != recorded.data_ptr()
    assert torch.equal(recorded, eager)


def test_with_the_kernel_a_string_layer_costs_what_a_rope_layer_costs(monkeypatch):
    """The kernel takes the passes' queries and masks as they are: per added layer, a
    StRing step dispatches exactly RoPE's operations (the CPU path adds the merge: softmax,
    product and sum in float32, two casts more in bf16).
    The launch itself is stubbed (not counted): only what surrounds it is."""
    from tests.model.test_decode_step import counted_step, model_and_method

    def per_layer(name: str, kernel: bool = False) -> float:
        two, four = (
            sum(counted_step(*model_and_method(name, layers, fused=True), kernel=kernel).ops.values())
            for layers in (2, 4)
        )
        return (four - two) / 2

    eager = {name: per_layer(name) for name in ("rope", "string")}
    monkeypatch.setattr(decode_kernel, "usable", lambda queries: True)
    monkeypatch.setattr(decode_kernel, "launch", lambda *args: None)
    assert {name: per_layer(name) for name in ("rope", "string")} == eager  # a cache without the kernel
    kernel = {name: per_layer(name, kernel=True) for name in ("rope", "string")}
    assert kernel["string"] == kernel["rope"], kernel
    assert eager["string"] >= eager["rope"] + 3, eager


def reference_launch(launches: list):
    """`decode_kernel.launch` as the float64 union softmax, each launch's output logged."""

    def launch(queries, k, v, seen, out, scale, buffers) -> None:
        launches.append(out)
        out.copy_(union_reference(queries, k, v, seen.bool(), scale))

    return launch


def test_the_kernel_runs_only_for_a_cache_that_opts_in(monkeypatch):
    """Where the kernel can run (stubbed as on CUDA, the launch a float64 reference): a
    default cache (`eval.cuda_decoding=eager`) decodes in torch's kernels; a cache that opts
    in launches once per layer and step (2 x 3), and its logits agree (fp32, 1e-5 of their
    range)."""
    from tests.model.test_decode_step import model_and_method

    launches: list[torch.Tensor] = []
    monkeypatch.setattr(decode_kernel, "usable", lambda queries: True)
    monkeypatch.setattr(decode_kernel, "launch", reference_launch(launches))
    model, method = model_and_method("string")
    ids = torch.randint(0, model.config.vocab_size, (2, 23), generator=torch.Generator().manual_seed(3))
    logits, counts = [], []
    for cache in (model.new_kv_cache(2, 23), model.new_kv_cache(2, 23, decode_kernel=True)):
        launches.clear()
        with torch.no_grad():
            model(ids[:, :20], kv_cache=cache, position_method=method)
            steps = [model(ids[:, t : t + 1], kv_cache=cache, position_method=method) for t in range(20, 23)]
        logits.append(torch.cat(steps, dim=1))
        counts.append(len(launches))
    assert counts == [0, 6]
    assert (logits[1] - logits[0]).abs().max() <= 1e-5 * logits[0].abs().max()


def test_two_caches_never_share_the_kernels_output(monkeypatch):
    """Two models decoding at one shape: each cache's steps write their own output, the
    same one at every layer and step (allocated once), never the other's."""
    from tests.model.test_decode_step import model_and_method

    launches: list[torch.Tensor] = []
    monkeypatch.setattr(decode_kernel, "usable", lambda queries: True)
    monkeypatch.setattr(decode_kernel, "launch", reference_launch(launches))
    models = [model_and_method("rope")[0] for _ in range(2)]
    caches = [model.new_kv_cache(1, 12, decode_kernel=True) for model in models]
    outputs = []
    with torch.no_grad():
        for model, cache in zip(models, caches, strict=True):
            model(torch.zeros(1, 8, dtype=torch.long), kv_cache=cache)
        for _ in range(2):
            for model, cache in zip(models, caches, strict=True):
                launches.clear()
                model(torch.ones(1, 1, dtype=torch.long), kv_cache=cache)
                outputs.append({out.data_ptr() for out in launches})
    assert outputs[0] == outputs[2] and outputs[1] == outputs[3] and len(outputs[0]) == 1
    assert outputs[0] != outputs[1]


def test_each_stream_of_a_cache_has_its_own_buffers(monkeypatch):
    """One owner on two streams (a graph's capture stream beside the eager steps): another
    output and workspace per stream; back on the first stream, the first's again. A cache
    that does not opt in has no buffers."""
    buffers = decode_kernel.KernelBuffers()
    shape, cpu = (1, 1, 4, 16), torch.device("cpu")
    first = buffers.output(shape, torch.float32, cpu), buffers.workspace((4,), torch.int32, cpu, zero=True)
    monkeypatch.setattr(decode_kernel, "stream_key", lambda device: 7)
    other = buffers.output(shape, torch.float32, cpu), buffers.workspace((4,), torch.int32, cpu, zero=True)
    assert all(a.data_ptr() != b.data_ptr() for a, b in zip(first, other, strict=True))
    monkeypatch.setattr(decode_kernel, "stream_key", lambda device: None)
    assert buffers.output(shape, torch.float32, cpu) is first[0]
    from tests.model.test_decode_step import model_and_method

    assert model_and_method("rope")[0].new_kv_cache(1, 4).kernel_buffers is None
