"""Context parallelism (train/context_parallel.py, model/sequence_shard.py): the mask of a
shard, the balancers, the config errors, and training on gloo ranks equal to one process
(float64: loss and every parameter gradient within GRADIENT_TOLERANCE)."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from longctx.config import load
from longctx.errors import ConfigError
from longctx.model.attention import _dense_mask
from longctx.model.sequence_shard import _dense_shard_mask, _flex_shard_mask
from longctx.train.context_parallel import balance_indices, imbalance, work_per_rank
from longctx.train.trainer import WorldSize
from tests.train.helpers import environment, finish, launch, losses, overrides

ROOT = Path(__file__).parents[2]
GRADIENT_TOLERANCE = 1e-14
"""float64: the sharded step differs from one process only in summation order (measured
<= 1e-16 on gradients of magnitude ~0.2)."""
LOSS_TOLERANCE = 1e-13


def packed_documents(lengths: list[int]) -> torch.Tensor:
    return torch.cat([torch.full((n,), i) for i, n in enumerate(lengths)])[None]


def local_rows(size: int, index: torch.Tensor, rank: int) -> torch.Tensor:
    return index.view(index.shape[0], size, -1)[:, rank]


@pytest.mark.parametrize("window", [0, 40])
@pytest.mark.parametrize("method", ["head_tail", "document"])
def test_a_shard_s_mask_is_the_rows_of_the_unsharded_mask_at_its_queries(window, method):
    documents = packed_documents([96, 32, 160, 64, 160])  # 512 tokens, each a multiple of 2 x 4
    index = balance_indices(documents, 4, method)
    full = _dense_mask(documents, documents.shape[1], window)[:, 0]
    for rank in range(4):
        rows = local_rows(4, index, rank)
        assert torch.equal(_dense_shard_mask(rows, documents, window)[:, 0], full[0, rows[0]][None])


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("window", [0, 100])
def test_the_flex_shard_block_mask_attends_as_the_dense_one(window):
    """Eager FlexAttention (CPU, no grad) with the shard's BlockMask against the dense sdpa
    mask, per simulated rank, over rows of 512 (blocks of 128: full, partial and empty)."""
    from torch.nn.attention.flex_attention import flex_attention

    documents = packed_documents([300, 40, 172])
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 512, 16, generator=generator, dtype=torch.float64) for _ in range(3))
    index = balance_indices(documents, 2, "head_tail")
    for rank in range(2):
        rows = local_rows(2, index, rank)
        local_q = q[:, :, rows[0]]
        dense = _dense_shard_mask(rows, documents, window)
        expected = torch.nn.functional.scaled_dot_product_attention(local_q, k, v, attn_mask=dense)
        with torch.no_grad():
            got = flex_attention(local_q, k, v, block_mask=_flex_shard_mask(rows, documents, window))
        assert (got - expected).abs().max() < 1e-12


@pytest.mark.gpu
@pytest.mark.parametrize("window", [0, 300])
def test_flex_on_every_rank_s_shard_mask_trains_as_the_dense_reference_on_cuda(window):
    """The backward FlexAttention lacks on CPU: N = 4 ranks simulated in one process, each
    rank's queries against the whole row's k/v (the gathered keys) through the compiled
    kernel with the shard's BlockMask; outputs and q/k/v gradients against dense sdpa in
    float32 (atol 2e-3: the kernels' TF32/accumulation order)."""
    from longctx.model.attention import _compiled_flex_attention

    documents = packed_documents([1000, 24, 512, 512]).cuda()  # 2,048 tokens
    generator = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(1, 4, 2048, 64, device="cuda", generator=generator).requires_grad_() for _ in range(3))
    index = balance_indices(documents, 4, "head_tail")

    def attend(flex: bool) -> list[torch.Tensor]:
        outputs = []
        for rank in range(4):
            rows = local_rows(4, index, rank)
            local_q = q[:, :, rows[0]]
            if flex:
                mask = _flex_shard_mask(rows, documents, window)
                outputs.append(_compiled_flex_attention()(local_q, k, v, block_mask=mask))
            else:
                dense = _dense_shard_mask(rows, documents, window)
                outputs.append(torch.nn.functional.scaled_dot_product_attention(local_q, k, v, attn_mask=dense))
        return outputs

    grad = torch.randn(1, 4, 512, 64, device="cuda", generator=generator)
    results = []
    for flex in (True, False):
        outputs = attend(flex)
        gradients = torch.autograd.grad(sum((out * grad).sum() for out in outputs), (q, k, v))
        results.append((outputs, gradients))
    for got, expected in zip([*results[0][0], *results[0][1]], [*results[1][0], *results[1][1]], strict=True):
        torch.testing.assert_close(got, expected, atol=2e-3, rtol=0)


def test_head_tail_balances_one_document_and_document_balances_any_packing():
    one = packed_documents([256])
    assert imbalance(work_per_rank(one, balance_indices(one, 4, "head_tail"), 4)) == 1.0
    packed = packed_documents([200, 8, 48])
    head_tail = imbalance(work_per_rank(packed, balance_indices(packed, 4, "head_tail"), 4))
    assert head_tail > 1.3  # one long document first: rank 0's head chunk holds its cheap start
    assert imbalance(work_per_rank(packed, balance_indices(packed, 4, "document"), 4)) == pytest.approx(1.0, abs=0.02)


def test_document_balance_gives_each_rank_a_head_and_a_tail_of_every_document():
    """Documents of 8 and 4 tokens at N = 2, worked by hand: chunks of 2 and of 1; rank 0
    holds chunks 0 and 3 of each, rank 1 chunks 1 and 2."""
    index = balance_indices(packed_documents([8, 4]), 2, "document")
    assert index.tolist() == [[0, 1, 6, 7, 8, 11, 2, 3, 4, 5, 9, 10]]


def test_document_balance_names_the_key_for_a_document_not_a_multiple_of_2n():
    with pytest.raises(ConfigError, match=r"train\.load_balance: .* multiple of 2 x train.context_parallel = 4.* 7"):
        balance_indices(packed_documents([7, 57]), 2, "document")


CP = ["train.strategy=fsdp", "train.context_parallel=2", "data.window=64", "model.max_position=64"]


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        (["train.context_parallel=2", "data.window=64", "model.max_position=64"], "train.context_parallel"),
        (
            [
                *CP[:2],
                "data.window=62",
                "model.max_position=64",
                "train.global_batch_tokens=62",
                "train.micro_batch_size=1",
            ],
            "train.context_parallel",
        ),
        ([*CP, "model.attention_backend=varlen"], "model.attention_backend"),
        ([*CP, "model.attention_backend=flash"], "model.attention_backend"),
    ],
)
def test_context_parallel_settings_that_cannot_work_are_one_line_errors_naming_the_key(extra, key):
    with pytest.raises(ConfigError) as error:
        load([], extra)
    assert error.value.key == key and "\n" not in str(error.value)


def test_a_context_parallel_size_that_does_not_divide_the_world_names_the_key():
    config = load([], [*CP[:2], "data.window=96", "model.max_position=96", "train.global_batch_tokens=768"])
    config.train.context_parallel = 3
    with pytest.raises(ConfigError, match=r"train\.context_parallel: 3 does not divide the world size 4"):
        WorldSize(devices=2, num_nodes=2).data_parallel(config)
    assert WorldSize(devices=3, num_nodes=2).data_parallel(config) == 2


def equivalence(nproc: int, size: int, tmp_path: Path, balance: str = "head_tail", *extra: str) -> dict:
    out = tmp_path / f"cp{size}-{nproc}.json"
    script = ROOT / "tests" / "train" / "cp_equivalence.py"
    command = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}", "--standalone"]
    done = subprocess.run(
        [*command, str(script), str(size), str(out), balance, *extra],
        cwd=ROOT,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(out.read_text())


def check_equal_to_one_process(result: dict) -> None:
    assert abs(result["loss"] - result["reference_loss"]) < LOSS_TOLERANCE
    assert result["largest_gradient"] > 1e-2  # the comparison is not between zeros
    worst = max(result["gradients"].items(), key=lambda item: item[1])
    assert worst[1] < GRADIENT_TOLERANCE, worst
    assert result["positions_equal"]
    assert result["transforms_equal"] == dict.fromkeys(("pose", "randpos", "longrecipe", "skipalign"), True)


def test_cp2_on_two_gloo_ranks_equals_one_process(tmp_path):
    check_equal_to_one_process(equivalence(2, 2, tmp_path))


@pytest.mark.slow
@pytest.mark.parametrize(("size", "balance"), [(4, "head_tail"), (4, "document"), (2, "head_tail")])
def test_four_gloo_ranks_equal_one_process(size, balance, tmp_path):
    """CP 4 (both balancers; `document` also balances the work exactly) and DP 2 x CP 2."""
    result = equivalence(4, size, tmp_path, balance)
    check_equal_to_one_process(result)
    if balance == "document":
        assert len(set(result["work_per_rank"])) == 1


FLEX_TOLERANCE = 1e-6
"""float32 (CPU FlexAttention takes no float64): compiled flex against sdpa, logits ~1e1."""


@pytest.mark.slow
def test_the_flex_path_s_forward_under_cp2_equals_one_process(tmp_path):
    """The model's flex backend on 2 gloo ranks (keys all-gathered, the shard's BlockMask,
    compiled) against one process's sdpa logits at each rank's row positions (measured
    8.9e-8); its backward is the `gpu` test above."""
    result = equivalence(2, 2, tmp_path, "head_tail", "flex")
    assert result["flex_forward"] < FLEX_TOLERANCE
    check_equal_to_one_process(result)


HYBRID_CP = {
    "model.attention_backend": "sdpa",
    "model.n_layers": 2,
    "model.global_every": 2,
    "model.sliding_window": 16,
    "train.strategy": "fsdp",
    "train.max_steps": 4,
    "train.checkpoint_every_steps": 2,
    "log.wandb_mode": "disabled",
}


@pytest.mark.slow
def test_pretrain_under_cp2_equals_one_process_counts_fi_once_and_resumes_at_cp1(workspace, tmp_path):
    """`longctx pretrain` on 2 gloo ranks at train.context_parallel=2 (float32): the losses
    of one process within 1e-6 relative, the same f(i) arrays, the device mesh printed; its
    checkpoint then resumes on one process (CP 1) to step 6."""
    sharded, one, resumed = tmp_path / "cp2", tmp_path / "one", tmp_path / "resumed"
    output = finish(launch(overrides(workspace, sharded, **HYBRID_CP, **{"train.context_parallel": 2}), nproc=2))
    assert "device mesh: data_parallel 1 x context_parallel 2" in output
    finish(launch(overrides(workspace, one, **HYBRID_CP)))
    assert losses(sharded) == pytest.approx(losses(one), rel=1e-6)
    for name in ("fi-step-0000002.npz", "fi-step-0000004.npz"):
        got, expected = np.load(sharded / "fi" / name), np.load(one / "fi" / name)
        assert all(np.array_equal(got[key], expected[key]) for key in expected.files)
    checkpoint = sharded / "checkpoints" / "last.ckpt"
    more = {**HYBRID_CP, "train.max_steps": 6, "train.resume": checkpoint}
    finish(launch(overrides(workspace, resumed, **more)))
    assert sorted(losses(resumed)) == [5, 6]


@pytest.mark.slow
def test_a_compiled_pretrain_under_cp2_has_the_eager_losses(workspace, tmp_path):
    """`train.compile` under context parallelism: each block compiled (after activation
    checkpointing, before FSDP) around the shard's all-gather trains as the eager blocks do,
    within 1e-5 relative (float32; inductor may reorder reductions: measured 3e-8 on the
    ProLong CP miniature)."""
    compiled, eager = tmp_path / "compiled", tmp_path / "eager"
    cp = {**HYBRID_CP, "train.context_parallel": 2, "train.max_steps": 2}
    finish(launch(overrides(workspace, compiled, **cp, **{"train.compile": True}), nproc=2))
    finish(launch(overrides(workspace, eager, **cp), nproc=2))
    assert sorted(losses(compiled)) == [1, 2]
    assert losses(compiled) == pytest.approx(losses(eager), rel=1e-5)


def test_the_memory_estimate_divides_activations_by_n_and_adds_the_gathered_keys():
    """At 64K on tinyllama-1.1b shapes: CP 8 holds 1/8 of the tokens' activations, plus per
    local token and layer the other 7 ranks' k and v (bf16: 2 x 2 x 4 heads x 64 x 7)."""
    from longctx.train.memory_budget import estimate_memory

    shape = ["model.preset=tinyllama-1.1b", "model.max_position=65536", "data.window=65536", "train.micro_batch_size=1"]
    shape += [
        "model.attention_backend=flex",
        "train.strategy=fsdp",
        "train.global_batch_tokens=1048576",
        "train.loss_chunk_tokens=4096",
    ]
    one = estimate_memory(load([], shape), 8, "bf16-mixed")
    cp = estimate_memory(load([], [*shape, "train.context_parallel=8"]), 8, "bf16-mixed")
    layers = load([], shape).model.n_layers + 1  # each held layer and the backward's temporaries
    gathered = 2 * 2 * 4 * 64 * 7
    assert cp.activations * 8 - one.activations == 65536 * layers * gathered
    assert cp.activations < one.activations / 6
    assert cp.parameters == one.parameters
