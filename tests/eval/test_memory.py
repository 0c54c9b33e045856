"""The NIAH memory estimate (eval/memory_estimate.py): each term against what the model really
allocates or a hand-worked number, and the refusal of a length that cannot fit, before
anything large is allocated."""

import itertools

import pytest
import torch

from longctx.cli import main
from longctx.config.model import ModelConfig
from longctx.data.corpus import embedded_documents
from longctx.eval.memory_estimate import (
    GIB,
    EvaluationMemoryError,
    available_memory,
    check_evaluation_memory,
    estimate_evaluation_memory,
)
from longctx.model.checkpoint import save_model
from longctx.model.llama import Llama

CONFIG = ModelConfig.from_preset("debug", vocab_size=512, max_position=256)


def test_weights_and_kv_cache_terms_equal_what_the_model_allocates():
    model = Llama(CONFIG)
    rows, length, new = 3, 40, 5
    estimate = estimate_evaluation_memory(CONFIG, length, rows=rows, tests=7, new_tokens=new)
    assert estimate.weights == sum(p.numel() * p.element_size() for p in model.parameters())
    cache = model.new_kv_cache(rows, length + new)
    with torch.no_grad():
        model(torch.zeros(rows, length, dtype=torch.long), kv_cache=cache)
    assert estimate.kv_cache == cache.keys.nbytes + cache.values.nbytes
    assert estimate.prompts == torch.zeros(7, length, dtype=torch.int64).nbytes


def test_chunk_terms_by_hand():
    """debug: d_model 64, d_ff 256, 4 heads, 2 kv heads, head_dim 16. Rows 2, L 1000, chunk 100:
    activations 2 x 100 x (6 x 64 + 3 x 256 + (4 + 4) x 16) x 4 = 2 x 100 x 1280 x 4 = 1,024,000;
    scores 2 x 4 x 100 x 1000 x 4 + mask 2 x 100 x 1000 = 3,400,000; logits 2 x 512 x 4 = 4,096."""
    estimate = estimate_evaluation_memory(CONFIG, 1000, rows=2, tests=1, new_tokens=0, prefill_chunk_tokens=100)
    assert (estimate.chunk_activations, estimate.attention_scores, estimate.logits) == (1_024_000, 3_400_000, 4_096)
    unchunked = estimate_evaluation_memory(CONFIG, 1000, rows=2, tests=1, new_tokens=0)
    assert unchunked.attention_scores == 10 * estimate.attention_scores
    flash = estimate_evaluation_memory(CONFIG, 1000, rows=2, tests=1, new_tokens=0, dense_attention=False)
    assert flash.attention_scores == 0


def test_weight_casts_are_one_compute_copy_under_autocast_and_hold_the_graph_casts():
    """fp32 weights with bf16 compute: one bf16 copy of the weights (autocast's casts, then
    the decoding graph's); none without autocast. The casts a recorded bf16 decoding step
    actually keeps (model/inference/graph.py, traced on CPU) fit in it."""
    from longctx.model.inference.graph import DecodeGraph
    from tests.model.helpers import Traced

    autocast = estimate_evaluation_memory(CONFIG, 40, rows=2, tests=1, new_tokens=4, compute_bytes=2)
    assert autocast.weight_casts == CONFIG.num_parameters() * 2
    assert estimate_evaluation_memory(CONFIG, 40, rows=2, tests=1, new_tokens=4).weight_casts == 0
    model = Llama(CONFIG).eval().fuse_projections_()
    cache = model.new_kv_cache(2, 44)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        model(torch.zeros(2, 40, dtype=torch.long), kv_cache=cache)
        graph = DecodeGraph(model, cache, record=Traced())
        for _ in range(2):
            graph.step(torch.zeros(2, 1, dtype=torch.long))
    assert graph.casts is not None
    kept = sum(cast.nbytes for _, _, cast in graph.casts.casts.values())  # (weight, its version, cast)
    assert 0 < kept <= autocast.weight_casts


def test_refusal_names_the_length_the_estimate_and_the_limit():
    estimate = estimate_evaluation_memory(CONFIG, 10**8, rows=1, tests=50, new_tokens=48)
    with pytest.raises(EvaluationMemoryError, match=r"length 100,000,000 needs an estimated .* GiB \(weights") as info:
        check_evaluation_memory(estimate, 8 * GIB, "MemAvailable of /proc/meminfo", length=10**8)
    assert "MemAvailable of /proc/meminfo + the loaded weights" in str(info.value)
    check_evaluation_memory(estimate, estimate.total - estimate.weights, "test", length=10**8)  # exactly fits


def test_available_memory_on_cpu_is_positive_and_named():
    available, source = available_memory(torch.device("cpu"))
    assert available > 0
    assert "MemAvailable" in source or "psutil" in source


def test_niah_refuses_an_impossible_length_before_building_prompts(tmp_path, monkeypatch, capsys):
    """The reported failure: `longctx niah CKPT --lengths 100000000` grew to 22 GB and was
    OOM-killed. Now: exit 2 with the limit named, and no prompt was built."""
    path = tmp_path / "m.safetensors"
    save_model(Llama(ModelConfig.from_preset("debug", max_position=256)), path)
    haystack = tmp_path / "haystack.txt"
    haystack.write_text("\n".join(doc.text for doc in itertools.islice(embedded_documents(("prose",)), 5)))

    def no_prompts(*args, **kwargs):
        raise AssertionError("prompts were built for an impossible length")

    monkeypatch.setattr("longctx.eval.niah.engine_task.make_samples", no_prompts)
    args = ["niah", str(path), "--lengths", "100000000", f"eval.niah.haystack={haystack}", "log.wandb_mode=disabled"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "length 100,000,000 needs an estimated" in err
    assert "available (MemAvailable of /proc/meminfo" in err or "psutil" in err
