"""model/inference/generation.py: mixed-length batches with per-row stops.

References: the full-recompute `greedy_generate_recompute` on NIAH prompts; Hugging Face
`generate` (greedy, EOS and stop strings, left padding with an attention mask) on a tiny
random transformers Llama; and, under every position method, each prompt decoded alone."""

import numpy as np
import pytest
import torch

from longctx.config.model import ModelConfig
from longctx.config.position_methods import POSITION_METHODS, PositionMethodConfig, StringConfig
from longctx.eval.niah.generator import make_samples
from longctx.model.hf import import_hf
from longctx.model.inference.generation import StopRule, generate, observe_logits
from longctx.model.inference.prefill import greedy_generate_recompute
from longctx.model.llama import Llama
from longctx.model.position_methods import build_position_method
from tests.chat_tokenizer import write_chat_tokenizer
from tests.model.hf_models import build_hf, save_hf

TRAINING_LENGTH = 48
ARMS = [*POSITION_METHODS, "string-repo"]


def test_equals_the_recompute_reference_on_niah_prompts(tokenizer, haystack, one_thread):
    torch.manual_seed(0)
    model = Llama(ModelConfig.from_preset("debug", init_std=0.2)).double().eval()
    samples = make_samples(tokenizer, haystack, 160, 5, seed=1)
    prompts = torch.from_numpy(np.stack([s.input_ids for s in samples]))
    reference = greedy_generate_recompute(model, prompts, 12).tolist()
    assert len({tuple(row) for row in reference}) > 1
    plain = generate(model, prompts.tolist(), max_new_tokens=12, batch_size=3)
    assert [g.token_ids for g in plain] == reference
    assert {g.stopped_by for g in plain} == {"length"}
    # The token the first row emits 6th as the EOS: rows stop there, the token left out.
    eos = reference[0][5]
    stopped = generate(model, prompts.tolist(), max_new_tokens=12, stop=StopRule(eos_ids=frozenset({eos})))
    for row, generation in zip(reference, stopped, strict=True):
        expected = row[: row.index(eos)] if eos in row else row
        assert generation.token_ids == expected
        assert generation.stopped_by == ("eos" if eos in row else "length")
    assert stopped[0].token_ids == reference[0][:5]


@pytest.mark.parametrize("chunk", [0, 7])
def test_mixed_lengths_equal_transformers_generate_with_eos_and_stop_strings(tmp_path, chunk):
    transformers = pytest.importorskip("transformers")
    vocab = 400
    hf_tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(write_chat_tokenizer(tmp_path / "tok", vocab) / "tokenizer.json")
    )
    hf = build_hf("llama-tied", vocab_size=vocab).double()
    save_hf(hf, tmp_path / "model", "single")
    ours = import_hf(tmp_path / "model", dtype=torch.float64).eval()
    lengths = [5, 31, 12, 20, 9]
    generator = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, vocab, (n,), generator=generator).tolist() for n in lengths]
    width, new = max(lengths), 20

    def hf_generate(**stops):
        ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        out = hf.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=new, do_sample=False, tokenizer=hf_tokenizer, **stops
        )
        return out[:, width:].tolist()

    free = hf_generate(eos_token_id=[vocab + 1], pad_token_id=0, min_new_tokens=new)
    eos = free[1][3]  # the token row 1 emits 4th: row 1 (and any row emitting it) stops on it
    # The first word-like token of row 2 past its 4th that it has not spelled before: row 2 stops there.
    stop_string = next(
        text
        for i in range(4, new)
        if (text := hf_tokenizer.decode(free[2][i : i + 1])).strip().isascii()
        and text.strip()
        and text not in hf_tokenizer.decode(free[2][:i])
    )
    assert eos not in free[2]  # so row 2 reaches its stop string
    expected = hf_generate(eos_token_id=[eos], pad_token_id=eos, stop_strings=[stop_string])
    expected = [row[: row.index(eos)] if eos in row else row for row in expected]  # HF pads with `eos`

    got = generate(
        ours,
        prompts,
        max_new_tokens=new,
        stop=StopRule(eos_ids=frozenset({eos}), stop_strings=(stop_string,)),
        decode=hf_tokenizer.decode,
        batch_size=5,
        prefill_chunk_tokens=chunk,
    )
    assert [g.token_ids for g in got] == expected
    assert {"eos", "stop_string"} <= {g.stopped_by for g in got}
    for generation in got:
        text = hf_tokenizer.decode(generation.token_ids)
        if generation.stopped_by == "stop_string":
            assert generation.text == text[: text.index(stop_string)]
        else:
            assert generation.text == text and stop_string not in text


def _method(arm: str, config: ModelConfig):
    if arm == "rope":
        return None
    name, _, compat = arm.partition("-")
    string = StringConfig(local_window=4, compat=compat or "paper")
    return build_position_method(PositionMethodConfig(name=name, string=string), config)


@pytest.fixture(scope="module")
def debug_model():
    torch.manual_seed(0)
    config = ModelConfig.from_preset("debug", vocab_size=256, max_position=TRAINING_LENGTH, init_std=0.2)
    return Llama(config).double().eval()


@pytest.mark.parametrize("arm", ARMS)
def test_batched_mixed_lengths_equal_each_prompt_alone(debug_model, arm, one_thread):
    method = _method(arm, debug_model.config)
    generator = torch.Generator().manual_seed(4)
    prompts = [torch.randint(0, 256, (n,), generator=generator).tolist() for n in (70, 23, 101, 55, 3)]
    batched = generate(
        debug_model, prompts, max_new_tokens=8, position_method=method, batch_size=5, prefill_chunk_tokens=16
    )
    alone = [generate(debug_model, [p], max_new_tokens=8, position_method=method)[0] for p in prompts]
    assert [g.token_ids for g in batched] == [g.token_ids for g in alone]
    assert len({tuple(g.token_ids) for g in alone}) > 1


def test_bad_arguments_are_refused(debug_model):
    with pytest.raises(ValueError, match="need a `decode`"):
        generate(debug_model, [[1, 2]], max_new_tokens=2, stop=StopRule(stop_strings=("x",)))
    with pytest.raises(ValueError, match="empty"):
        generate(debug_model, [[1, 2], []], max_new_tokens=2)
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(debug_model, [[1, 2]], max_new_tokens=0)


@pytest.mark.parametrize("stop", ["length", "eos"])
def test_the_next_step_is_queued_before_the_host_reads_the_tokens(debug_model, monkeypatch, stop):
    """The host's one read per step (the tokens, for the stop rules) comes after the next
    step was queued, so on a GPU the device decodes while the host checks; no step is
    queued past max_new_tokens, and when every row stops only one queued step is wasted.
    Same tokens as without the overlap (the other tests)."""
    events = []
    inside = []  # reads inside a forward (a prefill's plan) are not the loop's
    forward = debug_model.forward

    def step(*args, **kwargs):
        events.append("step" if args[0].shape[1] == 1 else "prefill")
        inside.append(True)
        try:
            return forward(*args, **kwargs)
        finally:
            inside.pop()

    def tolist(tensor):
        if not inside:
            events.append("read")
        return read(tensor)

    monkeypatch.setattr(debug_model, "forward", step)
    read = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", tolist)
    prompts = [[5, 9, 11, 4], [7, 3]]
    first = generate(debug_model, prompts, max_new_tokens=5)
    eos = frozenset({first[0].token_ids[2], first[1].token_ids[2]}) if stop == "eos" else frozenset()
    events.clear()
    generated = generate(debug_model, prompts, max_new_tokens=5, stop=StopRule(eos_ids=eos))
    decoding = events[events.index("step") :]
    assert events[: events.index("step")].count("read") == 0
    if stop == "length":
        assert decoding == ["step", "read"] * 4 + ["read"]
    else:  # both rows stop at their third token: the third read follows the queued fourth step
        assert [len(g.token_ids) for g in generated] == [2, 2]
        assert decoding == ["step", "read"] * 3


def test_an_observer_sees_each_steps_logits_before_the_argmax_and_only_inside_its_block(debug_model):
    """observe_logits: per batch, step 0 (the prefill's last column) then one call per
    generated token but the last (no step is decoded past max_new_tokens); each logits'
    argmax is the token generated; outside the block nothing is observed."""
    seen = []
    prompts = [[5, 9, 11, 4], [7, 3], [8, 8, 1]]
    with observe_logits(lambda step, logits: seen.append((step, logits.clone()))):
        generated = generate(debug_model, prompts, max_new_tokens=4, batch_size=2)
    assert [step for step, _ in seen] == [0, 1, 2, 3] * 2
    assert [tuple(logits.shape) for _, logits in seen] == [(2, 256)] * 4 + [(1, 256)] * 4
    by_length = sorted(range(3), key=lambda i: len(prompts[i]))  # batches go shortest first
    first = torch.stack([logits.argmax(-1) for _, logits in seen[:4]], dim=1).tolist()
    assert first == [generated[i].token_ids for i in by_length[:2]]
    assert [int(logits.argmax()) for _, logits in seen[4:]] == generated[by_length[2]].token_ids
    generate(debug_model, prompts, max_new_tokens=4)
    assert len(seen) == 8
