"""flex: the BlockMask built from document boundaries against torch's own dense
construction (`create_block_mask` over the document+causal mask_mod), its memory at 64K,
and decoding without recompiles."""

import random

import pytest
import torch
from torch._dynamo.testing import CompileCounter
from torch.nn.attention.flex_attention import flex_attention
from torch.utils._python_dispatch import TorchDispatchMode

from longctx.config.model import ModelConfig
from longctx.model import attention as attention_module
from longctx.model.attention import attention, build_mask
from longctx.model.llama import Llama
from tests.helpers import packed_document_ids
from tests.model.helpers import BLOCK_FIELDS, cached_greedy, dense_block_mask


def random_rows(rng: random.Random, batch: int, length: int, pad: int) -> torch.Tensor:
    """Rows of random document lengths (1 token up to several blocks); the last `pad`
    positions of each row are one padding document (id -1), as a collate pads."""
    rows = []
    for _ in range(batch):
        row: list[int] = []
        while len(row) < length - pad:
            row += [len(row)] * rng.choice([1, 2, 3, 50, 127, 128, 129, 200, 700])
        rows.append(row[: length - pad] + [-1] * pad)
    return torch.tensor(rows)


LAYOUTS = {
    "one-document": lambda rng: torch.zeros(2, 384, dtype=torch.long),
    "packed": lambda rng: packed_document_ids([37, 5, 1, 85, 128, 130, 1], batch=2),
    "padded": lambda rng: random_rows(rng, 3, 1000, pad=77),
    "ragged-random": lambda rng: random_rows(rng, 2, 643, pad=0),
    "single-token-documents": lambda rng: torch.arange(300).expand(1, -1).clone(),
    "short": lambda rng: packed_document_ids([3, 4]),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_block_mask_equals_create_block_mask(layout):
    document_ids = LAYOUTS[layout](random.Random(0))
    kv_len = document_ids.shape[1]
    for q_len in sorted({kv_len, 1, max(1, kv_len // 3), min(kv_len, 129)}):
        expected = dense_block_mask(document_ids, q_len)
        got = attention_module._flex_block_mask(document_ids, q_len)  # build_mask sends decoding to sdpa
        assert got.seq_lengths == expected.seq_lengths
        assert got.BLOCK_SIZE == expected.BLOCK_SIZE
        for name in BLOCK_FIELDS:
            assert torch.equal(getattr(got, name), getattr(expected, name)), (q_len, name)


class LargestTensor(TorchDispatchMode):
    """Records the bytes of the largest tensor any op creates."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in torch.utils._pytree.tree_leaves(out):
            if isinstance(tensor, torch.Tensor):
                self.largest = max(self.largest, tensor.numel() * tensor.element_size())
        return out


def test_block_mask_at_64k_allocates_no_quadratic_tensor():
    """Bound: no tensor above 8 bytes x B x max(T, (T / 128)^2) (int64 per-token starts,
    int32/int64 block tables), 2 MiB at T = 65,536; the dense [B, 1, T, T] boolean of
    create_block_mask is 4 GiB."""
    length = 65536
    document_ids = random_rows(random.Random(1), 1, length, pad=300)
    with LargestTensor() as tracker:
        mask = build_mask(document_ids, length, "flex").extra
    bound = 8 * max(length, (length // 128) ** 2)
    assert 0 < tracker.largest <= bound, tracker.largest
    assert mask.kv_num_blocks.shape == (1, 1, 512)


def test_flex_decoding_does_not_recompile(monkeypatch):
    """Prefill compiles flex once; 12 decoding steps (a growing key length) compile nothing:
    they run sdpa, whose mask is [1, Tk] per query."""
    counter = CompileCounter()
    compiled = torch.compile(flex_attention, backend=counter, dynamic=False)
    monkeypatch.setattr(attention_module, "_compiled_flex_attention", lambda: compiled)
    torch.manual_seed(0)
    model = Llama(ModelConfig.from_preset("debug", max_position=256))
    prompts = torch.randint(0, 8192, (2, 130))
    got = cached_greedy(model, prompts, 13, attention_backend="flex")
    assert counter.frame_count == 1
    expected = cached_greedy(model, prompts, 13, attention_backend="sdpa")
    assert torch.equal(got, expected)


def test_flex_decoding_matches_sdpa():
    document_ids = packed_document_ids([100, 40, 60], batch=2)
    for q_len in (1, 16, 17):
        q = torch.randn(2, q_len, 4, 16)
        k, v = torch.randn(2, 2, 200, 2, 16).unbind(0)
        assert build_mask(document_ids, q_len, "flex").backend == ("sdpa" if q_len <= 16 else "flex")
        with torch.no_grad():
            got = attention(q, k, v, document_ids=document_ids, backend="flex")
            expected = attention(q, k, v, document_ids=document_ids, backend="sdpa")
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
