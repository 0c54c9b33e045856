"""A recorded decoding step replayed (model/inference/graph.py) equals running the model.

On CPU a step is recorded by tracing (`make_fx`): like a CUDA graph, the trace keeps the
kernels and bakes every host number in, and replaying it mutates the same cache tensors.
A step that depended on the cache's host length (a slice at it, a fill with it) would
replay the recorded position and diverge from the eager model at the next step. The
eager reference is the same model on its own cache."""

import copy

import pytest
import torch

from longctx.config.model import ModelConfig
from longctx.config.position_methods import arm_config
from longctx.model.inference.graph import DecodeGraph
from longctx.model.llama import Llama
from longctx.model.position_methods import build_position_method, string_method
from tests.model.helpers import Traced

PROMPT, STEPS = 20, 6


def model_for(design: str) -> Llama:
    overrides = {"sliding": {"layer_types": ["sliding", "full"], "sliding_window": 8}}.get(design, {})
    torch.manual_seed(0)
    model = Llama(ModelConfig.from_preset("debug", n_layers=2, max_position=48, **overrides)).eval()
    return model.fuse_projections_() if design == "fused" else model


def method_for(name: str, model: Llama):
    if name == "string":
        return string_method(model.rope, shift=12, local_window=4)
    return None if name == "plain" else build_position_method(arm_config(name), model.config)


@pytest.mark.parametrize(
    "design, method",
    [("llama", "plain"), ("llama", "rope"), ("llama", "string"), ("fused", "plain"), ("sliding", "plain")],
)
def test_replayed_steps_equal_the_model(design, method):
    model = model_for(design)
    position_method = method_for(method, model)
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, model.config.vocab_size, (2, PROMPT + STEPS), generator=generator)
    documents = torch.zeros(2, PROMPT, dtype=torch.long)
    documents[1, PROMPT // 2 :] = 1  # row 1 decodes its second document
    caches = [model.new_kv_cache(2, PROMPT + STEPS) for _ in range(2)]
    with torch.no_grad():
        for cache in caches:
            model(ids[:, :PROMPT], document_ids=documents, kv_cache=cache, position_method=position_method)
        graph = DecodeGraph(model, caches[1], position_method, record=Traced())
        for t in range(PROMPT, PROMPT + STEPS):
            eager = model(ids[:, t : t + 1], kv_cache=caches[0], position_method=position_method)
            replayed = graph.step(ids[:, t : t + 1]).clone()
            assert (replayed - eager).abs().max() <= 1e-5, t
    assert graph.replay is not None and graph.steps == STEPS
    assert caches[1].length == caches[0].length == PROMPT + STEPS
    assert torch.equal(caches[1].end, caches[0].end)
    assert torch.equal(caches[1].next_position, caches[0].next_position)
    assert torch.equal(caches[1].keys, caches[0].keys)


def test_methods_without_a_fixed_shape_step_and_empty_caches_are_refused():
    model = model_for("llama")
    cache = model.new_kv_cache(1, 8)
    with pytest.raises(ValueError, match="after the prefill"):
        DecodeGraph(model, cache)
    with torch.no_grad():
        model(torch.zeros(1, 4, dtype=torch.long), kv_cache=cache)
    rerope = build_position_method(arm_config("rerope"), model.config)
    with pytest.raises(ValueError, match="rerope"):
        DecodeGraph(model, cache, rerope)
    graph = DecodeGraph(model, cache, record=Traced())
    with pytest.raises(ValueError, match=r"shape \(2, 1\)"):
        graph.step(torch.zeros(2, 1, dtype=torch.long))


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", [False, True], ids=["graph", "graph+kernel"])
@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16 autocast"])
def test_a_cuda_graph_replays_the_eager_steps(autocast, kernel):
    """Both caches with or without the decoding kernel: the replay against the same kernels run eagerly."""
    model = copy.deepcopy(model_for("fused")).cuda()
    model.fuse_projections_()
    ids = torch.randint(0, model.config.vocab_size, (2, PROMPT + STEPS), device="cuda")
    caches = [model.new_kv_cache(2, PROMPT + STEPS, decode_kernel=kernel) for _ in range(2)]
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
        for cache in caches:
            model(ids[:, :PROMPT], kv_cache=cache)
        graph = DecodeGraph(model, caches[1])
        for t in range(PROMPT, PROMPT + STEPS):
            eager = model(ids[:, t : t + 1], kv_cache=caches[0])
            assert (graph.step(ids[:, t : t + 1]) - eager).abs().max() <= (2e-2 if autocast else 1e-4), t
    assert graph.replay is not None


@pytest.mark.gpu
def test_two_models_recorded_side_by_side_replay_their_own_steps():
    """graph+kernel for two models at one shape, stepped alternately, one with a sliding
    window that fills during decoding (a 4-token prompt, W = 8): each cache's graph and
    kernel buffers are its own, and each model's replayed steps equal its eager ones."""
    steps, prompt = 12, 4
    models = [model_for("fused").cuda(), model_for("sliding").cuda()]
    ids = torch.randint(0, models[0].config.vocab_size, (2, prompt + steps), device="cuda")
    graphs, references = [], []
    with torch.no_grad():
        for model in models:
            caches = [model.new_kv_cache(2, prompt + steps, decode_kernel=True) for _ in range(2)]
            for cache in caches:
                model(ids[:, :prompt], kv_cache=cache)
            graphs.append(DecodeGraph(model, caches[1]))
            references.append(caches[0])
        for t in range(prompt, prompt + steps):
            for model, graph, cache in zip(models, graphs, references, strict=True):
                eager = model(ids[:, t : t + 1], kv_cache=cache)
                assert (graph.step(ids[:, t : t + 1]) - eager).abs().max() <= 1e-4, t
    assert all(graph.replay is not None for graph in graphs)


def test_under_autocast_a_recorded_step_reads_weights_cast_once():
    """bf16 autocast (on CPU here, CUDA's in the engine): the recorded step's trace holds
    no cast of a weight (without `WeightCasts` it casts every fp32 matrix of the fused
    layout at every replay), and its logits are bitwise the eager autocast model's."""
    model = model_for("fused")
    generator = torch.Generator().manual_seed(5)
    ids = torch.randint(0, model.config.vocab_size, (2, PROMPT + STEPS), generator=generator)
    caches = [model.new_kv_cache(2, PROMPT + STEPS) for _ in range(2)]
    weights = {tuple(p.shape) for p in model.parameters() if p.dim() == 2}
    weights |= {(sum(p.shape[0] for p in group), group[0].shape[1]) for group in _fused_groups(model)}
    recorder = Traced()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        for cache in caches:
            model(ids[:, :PROMPT], kv_cache=cache)
        graph = DecodeGraph(model, caches[1], record=recorder)
        for t in range(PROMPT, PROMPT + STEPS):
            eager = model(ids[:, t : t + 1], kv_cache=caches[0])
            assert torch.equal(graph.step(ids[:, t : t + 1]), eager), t
    assert graph.casts is not None and graph.casts.casts
    casts = [
        node
        for node in recorder.graphs[0].graph.nodes
        if node.target == torch.ops.aten._to_copy.default
        and tuple(node.args[0].meta["val"].shape) in weights
        and node.args[0].meta["val"].dtype == torch.float32
    ]
    assert casts == [], [tuple(node.args[0].meta["val"].shape) for node in casts]


def _fused_groups(model: Llama) -> list[list[torch.Tensor]]:
    """The weight matrices each fused matmul joins (q/k/v, gate/up)."""
    groups = []
    for block in model.blocks:
        groups.append([block.attn.wq.weight, block.attn.wk.weight, block.attn.wv.weight])
        groups.append([block.mlp.gate.weight, block.mlp.up.weight])
    return groups
