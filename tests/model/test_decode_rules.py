"""What decides how decoding runs (model/inference/graph.py `decoding_mode`, `eval.cuda_decoding`)
and what a recorded step may assume: no graph for a sharded model; weight casts keyed by the
weight, not its address; the eager step before a recording runs in the recorder's warm-up
(on CUDA the capture's side stream); a recording is never the first call of its shape.

On CPU a recorder stub stands in for the CUDA graph (`DecodeGraph`'s `record` seam): it
traces the step as tests/model/test_decode_graph.py does and logs, with a forward hook on
the model, every eager forward and its shape (the keys a sliding layer reads)."""

import contextlib
import logging
import socket

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Replicate, distribute_tensor
from torch.fx.experimental.proxy_tensor import make_fx

from longctx.config.model import ModelConfig
from longctx.model.inference import generation
from longctx.model.inference.graph import DecodeGraph, DecodingMode, WeightCasts, decoding_mode, sharded
from longctx.model.llama import Llama

WINDOW = 8


def tiny(sliding: bool = False) -> Llama:
    overrides = {"layer_types": ["sliding", "full"], "sliding_window": WINDOW} if sliding else {}
    torch.manual_seed(0)
    return Llama(ModelConfig.from_preset("debug", n_layers=2, max_position=48, **overrides)).eval()


class Logged:
    """A recorder that traces the step and logs its warm-ups, the model's forwards (with
    the step's shape) and its recordings, in order."""

    def __init__(self, model: Llama, cache):
        self.cache, self.events = cache, []
        model.register_forward_pre_hook(lambda module, args: self.events.append(("forward", self._shape())))

    def _shape(self) -> int:
        return self.cache.window_span(1)

    @contextlib.contextmanager
    def warm_up(self):
        self.events.append("warm-up")
        yield
        self.events.append("warm-up done")

    def record(self, step):
        self.events.append(("record", self._shape(), self.cache.length))
        return make_fx(lambda: step())(), True


def decoded(model: Llama, prompt: int, steps: int, recorder: bool) -> tuple[torch.Tensor, Logged | None]:
    """Logits of `steps` decoding steps after a `prompt`-token prefill of 2 rows, through a
    `DecodeGraph` with a `Logged` recorder (or the model eagerly)."""
    ids = torch.randint(0, model.config.vocab_size, (2, prompt + steps), generator=torch.Generator().manual_seed(1))
    cache = model.new_kv_cache(2, prompt + steps)
    with torch.no_grad():
        model(ids[:, :prompt], kv_cache=cache)
        logged = Logged(model, cache) if recorder else None
        graph = DecodeGraph(model, cache, record=logged) if logged else None
        logits = [
            (graph.step(ids[:, t : t + 1]).clone() if graph else model(ids[:, t : t + 1], kv_cache=cache))
            for t in range(prompt, prompt + steps)
        ]
    return torch.cat(logits, dim=1), logged


def test_the_step_before_a_recording_runs_in_the_warm_up():
    """torch's CUDA-graph notes: run the step eagerly on the capture's side stream first.
    The forward just before the recording is the warm-up's, at the recorded shape; the
    first step is eager and in a warm-up too; the replayed steps equal the eager model."""
    model = tiny()
    eager, _ = decoded(model, 12, 5, recorder=False)
    replayed, logged = decoded(tiny(), 12, 5, recorder=True)
    events = logged.events
    at = [index for index, event in enumerate(events) if event[0] == "record"]
    assert len(at) == 1, events
    shape = events[at[0]][1]
    assert events[at[0] - 3 : at[0]] == ["warm-up", ("forward", shape), "warm-up done"], events
    assert at[0] == 3  # the first step is that eager warm-up, the second is recorded
    assert (replayed - eager).abs().max() <= 1e-5


def test_a_recording_is_never_the_first_call_of_its_shape():
    """A sliding layer of window 8 keeps 7 keys: after a 4-token prompt it reads 5, 6, 7,
    then 8 keys from the step at length 7 on. That step is the first of its shape: it runs
    eagerly, and the recording comes at the next (length 8), after an eager call of the
    same shape. Every call before the recording was eager; the logits equal the model's."""
    eager, _ = decoded(tiny(sliding=True), 4, 8, recorder=False)
    replayed, logged = decoded(tiny(sliding=True), 4, 8, recorder=True)
    events = logged.events
    (record,) = [event for event in events if event[0] == "record"]
    before = [event for event in events[: events.index(record)] if event[0] == "forward"]
    assert [shape for _, shape in before] == [5, 6, 7, WINDOW]
    assert record == ("record", WINDOW, WINDOW), events
    assert (replayed - eager).abs().max() <= 1e-5


def test_weight_casts_are_keyed_by_the_weight_not_its_address():
    """Two weights one after the other at one address, offset, shape and stride (as FSDP
    all-gathers each layer's weight into a buffer the next layer's then reuses): the second
    gets its own cast, not the first's. A weight changed in place is cast again; an
    unchanged one is cast once."""
    storage = torch.empty(4, 3).untyped_storage()
    x = torch.randn(2, 3, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    values = [torch.randn(4, 3, generator=torch.Generator().manual_seed(seed)) for seed in (1, 2, 3)]

    def at_storage() -> torch.Tensor:
        return torch.empty(0).set_(storage, 0, (4, 3), (3, 1))

    def expected(weight: torch.Tensor) -> torch.Tensor:
        return F.linear(x, weight.to(torch.bfloat16))

    casts = WeightCasts(torch.bfloat16)
    at_storage().copy_(values[0])  # the gather's own write, through another tensor
    first = at_storage()
    with casts:
        assert torch.equal(F.linear(x, first), expected(values[0]))
    at_storage().copy_(values[1])
    second = at_storage()
    with casts:
        assert torch.equal(F.linear(x, second), expected(values[1]))
        second.copy_(values[2])
        assert torch.equal(F.linear(x, second), expected(values[2]))
    assert casts._cast(second) is casts._cast(second)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def mesh():
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,))
    finally:
        dist.destroy_process_group()


class NeverRecord:
    """A recorder that fails the test if a step is ever recorded."""

    def warm_up(self):
        return contextlib.nullcontext()

    def record(self, step):
        raise AssertionError("a step of a sharded model was recorded")


def test_a_sharded_model_is_never_recorded_and_says_so_once(mesh, monkeypatch, caplog):
    """`fully_shard` on a 1-rank gloo group: generate with cuda_decoding=graph builds no
    `DecodeGraph` (whose recorder here fails if called) and decodes eagerly, one log line
    for the call (2 batches of 4 steps); its tokens are the plain model's. The plain model
    on the same setting keeps its graph: one per batch, each recorded once."""
    plain = tiny()
    model = tiny()
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    graphs = []

    def stubbed(*args, **kwargs):
        graph = DecodeGraph(*args, **kwargs, record=NeverRecord() if sharded(args[0]) else Logged(args[0], args[1]))
        graphs.append(graph)
        return graph

    monkeypatch.setattr(generation, "DecodeGraph", stubbed)
    prompts = [[1, 2, 3, 4, 5], [6, 7, 8]]
    options = dict(max_new_tokens=4, batch_size=1, cuda_decoding="graph")
    with caplog.at_level(logging.INFO, logger="longctx.model.inference.graph"):
        got = generation.generate(model, prompts, **options)
    assert graphs == []
    lines = [record.getMessage() for record in caplog.records if record.name == "longctx.model.inference.graph"]
    assert len(lines) == 1 and "sharded" in lines[0], lines
    expected = generation.generate(plain, prompts, **options)
    assert [g.token_ids for g in got] == [g.token_ids for g in expected]
    assert len(graphs) == 2 and all(graph.replay is not None for graph in graphs)


def test_a_model_with_a_dtensor_parameter_is_sharded(mesh):
    """Any DTensor parameter (even without FSDP's modules) makes a model sharded: no graph
    (the kernel stays as set), and `DecodeGraph` refuses it."""
    model = tiny()
    assert not sharded(model) and decoding_mode("graph+kernel", model).graph
    model.norm.weight = nn.Parameter(distribute_tensor(model.norm.weight.detach(), mesh, [Replicate()]))
    assert sharded(model)
    assert decoding_mode("graph+kernel", model) == DecodingMode(graph=False, kernel=True)
    with pytest.raises(ValueError, match="sharded"):
        DecodeGraph(model, model.new_kv_cache(1, 8))


def test_generate_decodes_eagerly_unless_the_kernel_is_opted_into(monkeypatch):
    """Where the decoding kernel can run (stubbed as on CUDA, the launch a float64
    reference): `generate` by default never launches it; with cuda_decoding=kernel every
    decoding step's attention does (2 layers x 3 steps of 4 new tokens, the first token
    being the prefill's), and the tokens are the same."""
    from longctx.model.inference import kernel as decode_kernel
    from tests.model.test_decode_kernel import reference_launch

    launches: list[torch.Tensor] = []
    monkeypatch.setattr(decode_kernel, "usable", lambda queries: True)
    monkeypatch.setattr(decode_kernel, "launch", reference_launch(launches))
    model, prompts = tiny(), [[1, 2, 3, 4, 5], [6, 7, 8]]
    eager = generation.generate(model, prompts, max_new_tokens=4)
    assert launches == []
    kernel = generation.generate(model, prompts, max_new_tokens=4, cuda_decoding="kernel")
    assert len(launches) == 2 * 3
    assert [g.token_ids for g in kernel] == [g.token_ids for g in eager]


@pytest.mark.parametrize(
    "setting, graph, kernel",
    [("eager", False, False), ("kernel", False, True), ("graph", True, False), ("graph+kernel", True, True)],
)
def test_each_setting_decides_the_graph_and_the_kernel(setting, graph, kernel):
    mode = decoding_mode(setting, tiny())
    assert (mode.graph, mode.kernel) == (graph, kernel)


def test_an_unknown_setting_is_named():
    with pytest.raises(ValueError, match="'cuda-graph' is not one of"):
        decoding_mode("cuda-graph", tiny())
