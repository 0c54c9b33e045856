"""Shared helpers of the model tests: the dense float64 reference built from each
paper's modified relative position P', its inputs, one instance of every method, and
`string_attention` (StRing on un-rotated q/k/v in one call), and the dense flex
BlockMask reference."""

import contextlib
import math

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask

from longctx.model.attention import DEFAULT_BLOCK_SIZE
from longctx.model.position_methods import (
    dca_method,
    ntk_method,
    rerope_method,
    rope_method,
    self_extend_method,
    string_method,
    yarn_method,
)
from longctx.model.rope import RopeScaling, RotaryEmbedding
from tests.helpers import packed_document_ids, reset_position_ids

BASE = 10000.0
DIM = 16

# --- the reference ----------------------------------------------------------------------


def plain_frequencies(base: float = BASE, dim: int = DIM) -> torch.Tensor:
    """theta_i = base^(-2i/d), stored in float32 as a model stores them."""
    return (1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)).float().double()


def rotate(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """Rotate channel pairs (i, i + d/2) of x [..., d] by angles [..., d/2]."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * angles.cos() - x2 * angles.sin(), x2 * angles.cos() + x1 * angles.sin()], dim=-1)


def dense_reference(
    q, k, v, position_ids, document_ids, relative, frequencies, *, score_factor=1.0, query_factor=None, sinks=None
):
    """softmax over every (key n, relative position r in relative(m, n)) of the query's
    document with n <= m, score = <q rotated by r, k> * score_factor / sqrt(d). float64.
    sinks [H]: one more column of logit s_h and value 0 in every row's softmax (gpt-oss)."""
    q, k, v = q.double(), k.double(), v.double()
    batch, q_len, heads, dim = q.shape
    kv_len, kv_heads = k.shape[1], k.shape[2]
    k = k.repeat_interleave(heads // kv_heads, dim=2)
    v = v.repeat_interleave(heads // kv_heads, dim=2)
    entries = 2  # a (query, key) pair appears at most twice (StRing's repo compat diagonal)
    rel = torch.zeros(batch, q_len, kv_len, entries, dtype=torch.float64)
    valid = torch.zeros(batch, q_len, kv_len, entries, dtype=torch.bool)
    multiplier = torch.ones(batch, q_len, dtype=torch.float64)
    for b in range(batch):
        for i in range(q_len):
            query = kv_len - q_len + i
            m = int(position_ids[b, query])
            multiplier[b, i] = query_factor(m) if query_factor else 1.0
            for j in range(query + 1):
                if document_ids[b, j] == document_ids[b, query]:
                    values = relative(m, int(position_ids[b, j]))
                    rel[b, i, j, : len(values)] = torch.tensor(values, dtype=torch.float64)
                    valid[b, i, j, : len(values)] = True
    scaled = q * multiplier[..., None, None]
    angles = rel[..., None] * frequencies  # [B, Tq, Tk, E, d/2]
    rotated = rotate(scaled[:, :, None, None], angles[:, :, :, :, None, :])  # [B, Tq, Tk, E, H, D]
    scores = (rotated * k[:, None, :, None]).sum(-1) * score_factor / math.sqrt(dim)  # [B, Tq, Tk, E, H]
    scores = scores.masked_fill(~valid[..., None], -math.inf).flatten(2, 3)  # [B, Tq, Tk*E, H]
    if sinks is not None:
        sink = sinks.double().view(1, 1, 1, heads).expand(batch, q_len, 1, heads)
        scores = torch.cat([scores, sink], dim=2)
    weights = scores.softmax(2)[:, :, : kv_len * entries].reshape(batch, q_len, kv_len, entries, heads).sum(3)
    return torch.einsum("bqkh,bkhd->bqhd", weights, v)


def string_relative(shift, window):
    """STRING Eq. 4: P' = P - S + W where P >= S."""
    return lambda m, n: [m - n - shift + window] if m - n >= shift else [m - n]


def repo_string_relative(shift, window):
    """The released code: window pass [0, S] plus shifted pass [S, inf) -> P = S appears at S and at W."""

    def relative(m, n):
        p = m - n
        return [p] if p < shift else [shift, window] if p == shift else [p - shift + window]

    return relative


def rope_relative(m, n):
    return [m - n]


def rerope_relative(window):
    """Su (2023): P' = min(P, w)."""
    return lambda m, n: [min(m - n, window)]


def self_extend_relative(neighbor, group):
    """Jin et al. (2024): P' = P below w_n, else floor(m/G) - floor(n/G) + w_n - floor(w_n/G)."""
    return lambda m, n: [m - n] if m - n < neighbor else [m // group - n // group + neighbor - neighbor // group]


def dca_relative(chunk, window):
    """An et al. (2024) §3.1 with c = s + w: intra, successive and inter-chunk position indices."""
    c = chunk + window

    def relative(m, n):
        if m // chunk == n // chunk:
            return [m % chunk - n % chunk]
        if m // chunk - n // chunk == 1:
            succ = chunk + m % chunk if m % chunk < window else c - 1
            return [succ - n % chunk]
        return [c - 1 - n % chunk]

    return relative


# --- inputs -----------------------------------------------------------------------------


def random_qkv(batch, q_len, kv_len, heads=4, kv_heads=2, dim=DIM, dtype=torch.float64):
    q = torch.randn(batch, q_len, heads, dim, dtype=dtype)
    k = torch.randn(batch, kv_len, kv_heads, dim, dtype=dtype)
    v = torch.randn(batch, kv_len, kv_heads, dim, dtype=dtype)
    return q, k, v


def two_rows(lengths_row0, total):
    """Row 0: packed documents of the given lengths; row 1: one document of `total` tokens."""
    docs = torch.stack([packed_document_ids(lengths_row0)[0], torch.zeros(total, dtype=torch.long)])
    positions = torch.stack([reset_position_ids(lengths_row0)[0], torch.arange(total)])
    return positions, docs


def rotary(scaling=None, max_position=64, dim=DIM):
    return RotaryEmbedding(dim, BASE, scaling or RopeScaling(), max_position)


def all_methods():
    return {
        "rope": rope_method(rotary()),
        "ntk": ntk_method(DIM, BASE, 1.5, 64),
        "yarn": yarn_method(DIM, BASE, 1.5, 24, 64),
        "string": string_method(rotary(), 10, 3),
        "string-repo": string_method(rotary(), 10, 3, "repo"),
        "rerope": rerope_method(rotary(), 8, 16),
        "self_extend": self_extend_method(rotary(), 8, 3),
        "dca": dca_method(rotary(), 9, 4),
    }


def string_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    shift: int,
    local_window: int = 128,
    compat: str = "paper",
    position_ids: torch.Tensor | None = None,
    document_ids: torch.Tensor | None = None,
    rope_base: float = 10000.0,
    rope_scaling: RopeScaling | None = None,
    max_position: int | None = None,
    scale: float | None = None,
    backend: str = "auto",
    block_size: int = DEFAULT_BLOCK_SIZE,
) -> torch.Tensor:
    """StRing attention from un-rotated q [B, Tq, H, D], k/v [B, Tk, Hkv, D].

    position_ids/document_ids [B, Tk] describe the keys (queries are the last Tq); RoPE
    is `rope_base` with `rope_scaling` (max_position: the context that scaling is
    relative to, default Tk)."""
    rotary = RotaryEmbedding(q.shape[-1], rope_base, rope_scaling or RopeScaling(), max_position or k.shape[1]).to(
        q.device
    )
    method = string_method(rotary, shift, local_window, compat)
    return method.attend(
        q,
        k,
        v,
        position_ids=position_ids,
        document_ids=document_ids,
        backend=backend,
        scale=scale,
        block_size=block_size,
    )


BLOCK_FIELDS = (
    "kv_num_blocks",
    "kv_indices",
    "full_kv_num_blocks",
    "full_kv_indices",
    "q_num_blocks",
    "q_indices",
    "full_q_num_blocks",
    "full_q_indices",
)


def dense_block_mask(document_ids: torch.Tensor, q_len: int):
    """The reference: torch evaluates the mask_mod on every (query, key) pair."""
    batch, kv_len = document_ids.shape
    offset = kv_len - q_len

    def document_causal(b, h, q_idx, kv_idx):
        return (document_ids[b, q_idx + offset] == document_ids[b, kv_idx]) & (kv_idx <= q_idx + offset)

    return create_block_mask(document_causal, batch, None, q_len, kv_len, device="cpu")


def cached_greedy(model, input_ids, max_new_tokens, **options):
    """Greedy KV-cache decoding of the rows of `input_ids` [B, T] in one batch by the engine's
    decoder (`model.inference.generation.generate`, no stop rule): [B, max_new_tokens]. `options`:
    attention_backend, position_method, prefill_chunk_tokens."""
    import torch

    from longctx.model.inference.generation import generate

    rows = input_ids.tolist()
    generations = generate(model, rows, max_new_tokens=max_new_tokens, batch_size=len(rows), **options)
    return torch.tensor([g.token_ids for g in generations], device=input_ids.device)


def stepwise_logits(model, input_ids, prefill: int, document_ids=None, **options):
    """Logits of `input_ids` [B, T] through a KV cache: the first `prefill` tokens in one
    forward, then one token a step, concatenated ([B, T, vocab]): what must equal one full
    forward. `options`: position_method, attention_backend."""
    import torch

    def ids_of(part):
        return None if document_ids is None else document_ids[:, part]

    with torch.no_grad():
        cache = model.new_kv_cache(input_ids.shape[0], input_ids.shape[1])
        first = slice(0, prefill)
        steps = [model(input_ids[:, first], document_ids=ids_of(first), kv_cache=cache, **options)]
        for t in range(prefill, input_ids.shape[1]):
            step = slice(t, t + 1)
            steps.append(model(input_ids[:, step], document_ids=ids_of(step), kv_cache=cache, **options))
    return torch.cat(steps, dim=1)


def assert_decoding_equals_prefill(method, length: int = 28, **prefill_options) -> None:
    """One-token decoding over a growing cache (rotated keys where the method caches them)
    equals the prefill's rows, to 1e-12 in float64, on two packed rows ([15, 13] and one
    document); `prefill_options` (a block size, sinks) go to the prefill, sinks to every step."""
    positions, docs = two_rows([15, 13], length)
    q, k, v = random_qkv(2, length, length)
    prefill = method.attend(q, k, v, position_ids=positions, document_ids=docs, **prefill_options)
    rotated = method.caches_rotated_keys
    cache = method.rotate_keys(k, positions) if rotated else k
    step_options = {"sinks": prefill_options["sinks"]} if "sinks" in prefill_options else {}
    for t in range(length):
        step = decoding_step(method, t, q, cache, v, positions, docs, keys_rotated=rotated, **step_options)
        torch.testing.assert_close(step, prefill[:, t], atol=1e-12, rtol=0)


def decoding_step(method, t: int, q, k, v, positions, docs, **options) -> torch.Tensor:
    """Row t [B, H, D] of a one-token decoding step: query t against keys 0..t (`k` as the
    cache holds them; `options` such as keys_rotated, backend, sinks go to `attend`)."""
    return method.attend(
        q[:, t : t + 1],
        k[:, : t + 1],
        v[:, : t + 1],
        position_ids=positions[:, : t + 1],
        document_ids=docs[:, : t + 1],
        **options,
    )[:, 0]


def require_backend(backend: str) -> None:
    """Skip unless the attention backend can run here: `flash` needs a varlen kernel
    (flash-attn 2, or torch's varlen_attn; flash-attn-4's `flash_attn.cute` namespace
    alone is neither), the others their package."""
    if backend == "flash":
        from longctx.model import flash

        if not flash.available():
            pytest.skip("no varlen flash kernel: flash-attn 2 or torch >= 2.11's varlen_attn")
        return
    pytest.importorskip({"xformers": "xformers", "flex": "torch"}[backend])


class Traced:
    """A decoding-step recorder for CPU tests (model/inference/graph.py `Recorder`): the step
    traced with make_fx, which bakes host numbers in as a CUDA graph does; `graphs` keeps
    each trace."""

    def __init__(self):
        self.graphs = []

    def warm_up(self):
        return contextlib.nullcontext()

    def record(self, step):
        from torch.fx.experimental.proxy_tensor import make_fx

        graph = make_fx(lambda: step())()
        self.graphs.append(graph)
        return graph, True


def random_hf_model(config_class: str, model_class: str, **config):
    """A random transformers `model_class` of `config_class(**config)`, seed 0, with its
    biases and norm weights drawn too: transformers zeroes biases and sets norms to 1 or 0,
    where a wrong offset or a missed bias would hide."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = getattr(transformers, model_class)(getattr(transformers, config_class)(**config)).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith(".bias") or "norm" in name:
                parameter.add_(torch.randn_like(parameter) * 0.3)
    return model


def random_ids(length: int, vocab_size: int, rows: int = 2) -> torch.Tensor:
    """[rows, length] token ids in [3, vocab_size), seed 1 (ids 0-2: the special tokens)."""
    return torch.randint(3, vocab_size, (rows, length), generator=torch.Generator().manual_seed(1))


def assert_import_matches_transformers(hf, directory, prompt: torch.Tensor, tolerance: float, tolerance_fp64: float):
    """`hf` saved to `directory` and read back by longctx's `import_hf`: its float32 logits
    within `tolerance` of transformers' (which must be far from zero), its cached greedy
    tokens equal to transformers' `generate` (20-token prompt, 24 new tokens), and its
    float64 logits within `tolerance_fp64`. Returns the float64 model and its logits."""
    from longctx.model.hf import import_hf

    hf.save_pretrained(directory)
    ours = import_hf(directory).eval()
    with torch.no_grad():
        theirs, mine = hf(prompt).logits, ours(prompt)
    assert theirs.abs().max() > 1.0
    assert (mine - theirs).abs().max() <= tolerance
    expected = hf.generate(prompt[:, :20], max_new_tokens=24, min_new_tokens=24, do_sample=False, pad_token_id=0)
    assert torch.equal(cached_greedy(ours, prompt[:, :20], 24), expected[:, 20:])
    hf64, ours64 = hf.double(), import_hf(directory, dtype=torch.float64).eval()
    with torch.no_grad():
        full = ours64(prompt)
        assert (full - hf64(prompt).logits).abs().max() <= tolerance_fp64
    return ours64, full
