"""Operations and host syncs of one cached decoding step, counted on CPU (no timing).

    .venv/bin/python benchmarks/decode_ops.py [--backend flash|varlen] [--dtype bfloat16|float32]
        [--prompt 1536] [--layers 22]

On a GPU, a decoding step of a small model is bound by Python dispatch (~20 us per aten
operation) and by host syncs (the host waits for the device, so nothing is queued ahead
and CUDA-graph capture is impossible). Both are deterministic properties of the code, so
they are counted here, on CPU, under a `TorchDispatchMode`:

- the model: tinyllama-1.1b's depth and head layout (22 layers, 32 query heads, 4 key/value
  heads) at a CPU width (d_model 512, head_dim 16, d_ff 1,024, vocabulary 1,024), training
  length 512, seeded random weights, `--dtype` weights (bf16 as on the GPU);
- a prompt of `--prompt` tokens (past the training length, so StRing's shifted pass
  covers keys) prefilled into a KV cache of prompt + 8 positions, one warm-up decoding
  step, then ONE counted decoding step (`Llama.forward` of one token per row);
- `--backend flash` (the GPU path): torch's `varlen_attn` is replaced by `varlen_attn`
  below, a wrapper with torch 2.14's signature around one opaque custom op
  (`decode_ops_bench::varlen_attn`, per-segment sdpa inside), so each kernel call counts
  as one operation whatever it does inside; the decoding attention takes the CUDA path,
  model/inference/kernel.py, whose Triton launch is the opaque `decode_ops_bench::decode_attend`
  (everything around the launch runs as on CUDA). `--backend varlen` (the CPU default):
  the kernels are torch's fused CPU attention ops, also one operation each, and StRing's
  passes are merged by four operations per layer;
- operations: every aten call that is not a view (views allocate nothing and launch no
  kernel), per layer = total / layers (the embedding, the final norm and the head
  included); syncs: `_local_scalar_dense` (`.item()`, `bool()`, `int()`), `nonzero`, and
  `Tensor.tolist` calls (on CPU tolist reads memory without an aten call, so it is
  counted by wrapping the method).

Rows: `rope` = the model's own RoPE (`position_method=None`), `rope (method)` = the
PositionMethod path (`rope_method`, as `eval.position_method.name=rope` builds it),
`string` = StRing (S = 171, W = 128). Results: docs/benchmarks.md, "Decode step
operations (CPU proxy)".
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import sys

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from longctx.config.model import ModelConfig
from longctx.config.position_methods import arm_config
from longctx.model.inference import kernel as decode_kernel
from longctx.model.llama import Llama
from longctx.model.position_methods import build_position_method

SEED = 0
SYNC_OPS = ("_local_scalar_dense", "nonzero")
TRAINING_LENGTH = 512
_HOST_LIST = torch.Tensor.tolist
_RMS_NORM = torch.nn.functional.rms_norm
"""The kernel stand-in's own reads (inside the opaque op, not the step's) go through this."""


def bench_config(layers: int) -> ModelConfig:
    """tinyllama-1.1b's depth and heads at a CPU width (module docstring)."""
    return ModelConfig.from_preset(
        "tinyllama-1.1b",
        d_model=512,
        n_layers=layers,
        n_heads=32,
        n_kv_heads=4,
        d_ff=1024,
        vocab_size=1024,
        max_position=TRAINING_LENGTH,
    )


@torch.library.custom_op("decode_ops_bench::varlen_attn", mutates_args=())
def _varlen_kernel(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seq_q: torch.Tensor,
    cu_seq_k: torch.Tensor,
    seqused_k: torch.Tensor | None,
    max_q: int,
    max_k: int,
    scale: float,
    window_left: int,
    window_right: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """torch's varlen_attn semantics (bottom-right aligned window, GQA by head groups,
    `seqused_k`: only the first seqused_k[i] keys of segment i), by sdpa per segment.
    Returns out [Nq, H, D] and lse [H, Nq] fp32; a query without keys gets 0 and -inf."""
    heads, group = query.shape[1], query.shape[1] // key.shape[1]
    out = torch.zeros_like(query)
    lse = torch.full((heads, query.shape[0]), float("-inf"))
    used = None if seqused_k is None else _HOST_LIST(seqused_k)
    starts_q, starts_k = _HOST_LIST(cu_seq_q), _HOST_LIST(cu_seq_k)
    for i in range(len(starts_q) - 1):
        q0, q1, k0 = starts_q[i], starts_q[i + 1], starts_k[i]
        k1 = starts_k[i + 1] if used is None else k0 + used[i]
        if q1 == q0 or k1 == k0:
            continue
        q = query[q0:q1].transpose(0, 1).float()
        k = key[k0:k1].transpose(0, 1).float().repeat_interleave(group, 0)
        v = value[k0:k1].transpose(0, 1).float().repeat_interleave(group, 0)
        sq, sk = q1 - q0, k1 - k0
        row = torch.arange(sq)[:, None] + sk - sq
        column = torch.arange(sk)[None]
        allowed = torch.ones(sq, sk, dtype=torch.bool)
        if window_left >= 0:
            allowed &= column >= row - window_left
        if window_right >= 0:
            allowed &= column <= row + window_right
        scores = (q @ k.transpose(1, 2)) * scale
        scores = scores.masked_fill(~allowed, float("-inf"))
        part = torch.logsumexp(scores, -1)
        weights = torch.exp(scores - part[..., None]).nan_to_num(0.0)
        out[q0:q1] = (weights @ v).transpose(0, 1).to(query.dtype)
        lse[:, q0:q1] = part
    return out, lse


@_varlen_kernel.register_fake
def _(query, key, value, cu_seq_q, cu_seq_k, seqused_k, max_q, max_k, scale, window_left, window_right):
    return torch.empty_like(query), query.new_empty(query.shape[1], query.shape[0], dtype=torch.float32)


def varlen_attn(
    query,
    key,
    value,
    cu_seq_q,
    cu_seq_k,
    max_q,
    max_k,
    *,
    return_aux=None,
    scale=None,
    window_size=(-1, -1),
    enable_gqa=False,
    seqused_k=None,
    block_table=None,
    num_splits=None,
):
    """torch 2.14's `varlen_attn` signature around the one opaque custom op."""
    if key.shape[1] != query.shape[1] and not enable_gqa:
        raise ValueError("fewer key/value heads need enable_gqa=True")
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    out, lse = _varlen_kernel(
        query, key, value, cu_seq_q, cu_seq_k, seqused_k, max_q, max_k, scale, window_size[0], window_size[1]
    )
    return (out, lse) if return_aux is not None else out


@torch.library.custom_op("decode_ops_bench::rms_norm", mutates_args=())
def _rms_norm_kernel(x: torch.Tensor, dim: int, eps: float | None) -> torch.Tensor:
    """torch's `rms_norm` without weight, as one operation: CUDA runs it as one kernel
    (`aten::_fused_rms_norm`); on CPU torch decomposes it."""
    return _RMS_NORM(x, (dim,), None, eps)


@_rms_norm_kernel.register_fake
def _(x, dim, eps):
    return torch.empty_like(x)


def rms_norm(x, normalized_shape, weight=None, eps=None):
    """`torch.nn.functional.rms_norm` as CUDA dispatches it: one fused kernel."""
    out = _rms_norm_kernel(x, normalized_shape[-1], eps)
    return out if weight is None else out * weight


@torch.library.custom_op("decode_ops_bench::decode_attend", mutates_args=("out",))
def _decode_kernel(
    queries: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seen: torch.Tensor, out: torch.Tensor, scale: float
) -> None:
    """model/inference/kernel.py's launch as one operation: out [B, 1, H, D] = the softmax
    over the union of the passes' (query, key) scores, GQA by head groups, in fp32."""
    group = queries.shape[2] // k.shape[2]
    keys, values = (x.float().repeat_interleave(group, dim=2) for x in (k, v))
    scores = torch.einsum("bphd,bthd->bhpt", queries.float(), keys) * scale
    scores = scores.masked_fill(seen[:, None] == 0, float("-inf"))
    weights = torch.softmax(scores.flatten(2), dim=-1).view_as(scores).sum(dim=2)
    out.copy_(torch.einsum("bht,bthd->bhd", weights, values)[:, None])


def decode_launch(queries, k, v, seen, out, scale, buffers) -> None:
    """`decode_kernel.launch` as CUDA dispatches it: one Triton launch."""
    _decode_kernel(queries, k, v, seen, out, scale)


class StepCounter(TorchDispatchMode):
    """Non-view aten operations and host syncs (module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter[str] = collections.Counter()
        self.views = 0
        self.syncs: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if func.is_view:
            self.views += 1
        else:
            self.ops[name] += 1
        if name in SYNC_OPS:
            self.syncs[name] += 1
        return func(*args, **(kwargs or {}))

    @contextlib.contextmanager
    def counting(self):
        """Inside: the dispatch mode on and `Tensor.tolist` counted as a sync."""
        original = torch.Tensor.tolist

        def tolist(tensor):
            self.syncs["tolist"] += 1
            return original(tensor)

        torch.Tensor.tolist = tolist  # type: ignore[method-assign]
        try:
            with self:
                yield self
        finally:
            torch.Tensor.tolist = original  # type: ignore[method-assign]


def count_step(model: Llama, method, backend: str, prompt: int) -> StepCounter:
    """Prefill `prompt` tokens, decode one warm-up token, count the next decoding step."""
    generator = torch.Generator().manual_seed(SEED)
    ids = torch.randint(0, model.config.vocab_size, (1, prompt + 2), generator=generator)
    cache = model.new_kv_cache(1, prompt + 8, decode_kernel=backend == "flash")  # the kernel: CUDA's path
    options = dict(kv_cache=cache, attention_backend=backend, position_method=method)
    with torch.no_grad():
        model(ids[:, :prompt], last_logits_only=True, **options)
        model(ids[:, prompt : prompt + 1], **options)
        counter = StepCounter()
        with counter.counting():
            model(ids[:, prompt + 1 :], **options)
    return counter


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=("flash", "varlen"), default="flash")
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    parser.add_argument("--prompt", type=int, default=768)
    parser.add_argument("--layers", type=int, default=22)
    parser.add_argument(
        "--unfused", action="store_true", help="without Llama.fuse_projections_ (separate q/k/v, gate/up)"
    )
    parser.add_argument("--detail", action="store_true", help="list every operation with its count")
    args = parser.parse_args()
    if args.backend == "flash":
        import torch.nn.attention.varlen as varlen_module

        sys.modules["flash_attn"] = None  # type: ignore[assignment]  # torch's kernel, not flash-attn's
        varlen_module.varlen_attn = varlen_attn  # type: ignore[assignment]
        torch.nn.functional.rms_norm = rms_norm  # type: ignore[assignment]
        decode_kernel.usable = lambda queries: queries.dtype in decode_kernel.KERNEL_DTYPES  # as on CUDA
        decode_kernel.launch = decode_launch  # type: ignore[assignment]
    torch.manual_seed(SEED)
    config = bench_config(args.layers)
    model = Llama(config).to(getattr(torch, args.dtype)).eval()
    if not args.unfused:
        model.fuse_projections_()
    rows = {
        "rope": None,
        "rope (method)": build_position_method(arm_config("rope"), config),
        "string": build_position_method(arm_config("string"), config),
    }
    print(
        f"torch {torch.__version__}, backend {args.backend}, {args.dtype}, {args.layers} layers, prompt {args.prompt}"
    )
    print("| row | ops per step | ops per layer | views per step | syncs per step | syncs |")
    print("| --- | ---: | ---: | ---: | ---: | --- |")
    for name, method in rows.items():
        counter = count_step(model, method, args.backend, args.prompt)
        total = sum(counter.ops.values())
        syncs = " ".join(f"{op}:{n}" for op, n in sorted(counter.syncs.items())) or "-"
        line = f"| {name} | {total} | {total / args.layers:.1f} | {counter.views} | {sum(counter.syncs.values())} | {syncs} |"
        print(line, flush=True)
        if args.detail:
            print("    " + " ".join(f"{op}:{n}" for op, n in counter.ops.most_common()))


if __name__ == "__main__":
    main()
