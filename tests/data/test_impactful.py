"""LongRecipe impactful tokens: score differences against a direct prefix-by-prefix two-model
computation, the top-fraction report against a brute-force count, and the CLI's
selection as a dataset the trainer reads."""

import dataclasses
import json

import numpy as np
import pytest
import torch
from litdata import StreamingDataset

from longctx.cli import main
from longctx.config.model import ModelConfig
from longctx.data.corpus import embedded_documents
from longctx.data.impactful_selection import REPORT_FILE, analyse, token_class
from longctx.data.packing import PackedSource
from longctx.data.prepare import check_dataset, prepare
from longctx.data.sentences import sentence_end_table, sentence_lengths
from longctx.data.tokenizer import load_tokenizer, train_bpe
from longctx.model.checkpoint import save_model
from longctx.model.llama import Llama
from longctx.probes.impactful_scoring import score_differences


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny forwards are per-op overhead; extra threads only contend on a shared machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tiny_model(seed, vocab_size=300, max_position=64):
    torch.manual_seed(seed)
    config = dataclasses.replace(ModelConfig.from_preset("debug"), vocab_size=vocab_size, max_position=max_position)
    return Llama(config).eval()


@pytest.mark.parametrize("score", ["logprob", "logit"])
def test_score_differences_match_a_prefix_by_prefix_two_model_computation(score):
    base, extended = tiny_model(0), tiny_model(1, max_position=256)
    tokens = torch.randint(0, 300, (2, 16))
    fast = score_differences(base, extended, tokens, score)
    assert fast.shape == (2, 15)
    for row in range(2):
        for t in range(1, 16):
            prefix = tokens[row : row + 1, :t]  # the model sees only x_<t: no reliance on the causal mask
            with torch.no_grad():
                last = [model(prefix)[0, -1].double() for model in (base, extended)]
            if score == "logprob":
                last = [torch.log_softmax(x, dim=-1) for x in last]
            expected = last[1][tokens[row, t]] - last[0][tokens[row, t]]
            assert abs(float(fast[row, t - 1]) - float(expected)) < 1e-4


def test_token_classes_by_hand():
    assert [token_class(t) for t in ["12", " 7", "a1", ".", " ,", '."', " the", "\n\n", " ", "é"]] == [
        "digit",
        "digit",
        "digit",
        "punct",
        "punct",
        "punct",
        "word",
        "space",
        "space",
        "word",
    ]


class _Vocabulary:
    """A tokenizer stand-in: id -> text."""

    def __init__(self, texts):
        self.texts = texts

    def decode(self, ids):
        return "".join(self.texts[i] for i in ids)


def test_analysis_keeps_the_top_fraction_and_counts_classes_by_brute_force():
    vocabulary = _Vocabulary([" the", "7", ".", " cat", "\n"])
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 5, size=200)
    deltas = rng.normal(size=200) * np.where(tokens == 1, 5.0, 1.0)  # digits change most
    result = analyse(tokens, deltas, vocabulary, fraction=0.2, score="logprob")
    magnitudes = np.abs(deltas)
    top = [i for i in range(200) if (magnitudes > magnitudes[i]).sum() < 40]  # the 40 largest
    assert len(top) == 40
    classes = {0: "word", 1: "digit", 2: "punct", 3: "word", 4: "space"}
    for kind in ("word", "digit", "punct", "space"):
        assert result.classes[kind]["tokens"] == sum(classes[t] == kind for t in tokens.tolist())
        assert result.classes[kind]["selected"] == sum(classes[tokens[i]] == kind for i in top)
        total = sum(magnitudes[i] for i in range(200) if classes[tokens[i]] == kind)
        assert abs(result.classes[kind]["delta_sum"] - total) < 1e-6
    assert "digit" in result.anchors and "word" not in result.anchors
    assert result.top_tokens[0]["token"] == 1


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    root = tmp_path_factory.mktemp("impactful")
    texts = [doc.text for _, doc in zip(range(30), embedded_documents(("prose",)), strict=False)]
    texts[0] = "In 1999 there were 42 cats. Nobody counted the dogs! Why 7? " + texts[0]
    corpus = root / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    train_bpe(texts, vocab_size=300, path=root / "tokenizer.json")
    prepare(str(corpus), root / "data", str(root / "tokenizer.json"), verbose=False)
    save_model(tiny_model(0, max_position=32), root / "base.safetensors")
    save_model(tiny_model(1, max_position=64), root / "extended.safetensors")
    return root


def kept_sentences_come_from_the_source(workspace, out, must_hold):
    tokenizer = load_tokenizer(str(workspace / "tokenizer.json"))
    check_dataset(out, tokenizer)  # the trainer accepts it
    ends = sentence_end_table(tokenizer)
    sources = [np.asarray(d) for d in StreamingDataset(str(workspace / "data"), shuffle=False)]
    written = [np.asarray(d) for d in StreamingDataset(str(out), shuffle=False)]
    assert 0 < len(written) <= len(sources) and PackedSource(out, seed=0).epoch_tokens > 0
    for document in written:
        assert document[-1] == tokenizer.eos_id
        body = document[:-1]
        for piece in np.split(body, np.cumsum(sentence_lengths(body, ends))[:-1]):
            assert must_hold(tokenizer.decode(piece.tolist()))
    return written


def test_cli_digits_method_keeps_exactly_the_sentences_with_digits(workspace, tmp_path):
    out = tmp_path / "digits"
    assert (
        main(
            [
                "impactful-tokens",
                str(workspace / "base.safetensors"),
                str(workspace / "extended.safetensors"),
                str(workspace / "data"),
                "--out",
                str(out),
                "--method",
                "digits",
                "--keep-other",
                "0",
                "--tokenizer",
                str(workspace / "tokenizer.json"),
            ]
        )
        == 0
    )
    written = kept_sentences_come_from_the_source(workspace, out, lambda s: any(c.isdigit() for c in s))
    tokenizer = load_tokenizer(str(workspace / "tokenizer.json"))
    assert tokenizer.decode(written[0][:-1].tolist()).startswith("In 1999 there were 42 cats. Why 7?")


def test_cli_logits_method_writes_the_report_and_the_anchor_selection(workspace, tmp_path):
    out = tmp_path / "logits"
    assert (
        main(
            [
                "impactful-tokens",
                str(workspace / "base.safetensors"),
                str(workspace / "extended.safetensors"),
                str(workspace / "data"),
                "--out",
                str(out),
                "--samples",
                "2",
                "--anchor-classes",
                "digit",
                "--tokenizer",
                str(workspace / "tokenizer.json"),
            ]
        )
        == 0
    )
    report = json.loads((out / REPORT_FILE).read_text())
    assert report["length"] == 64 and report["scored_tokens"] == 2 * 63
    assert sum(row["selected"] for row in report["classes"].values()) == round(0.2 * 126)
    assert report["selection"]["anchor_classes"] == ["digit"]
    kept_sentences_come_from_the_source(workspace, out, lambda s: any(c.isdigit() for c in s))


def test_cli_names_the_dataset_when_it_is_too_short_for_the_samples(workspace, tmp_path, capsys):
    assert (
        main(
            [
                "impactful-tokens",
                str(workspace / "base.safetensors"),
                str(workspace / "extended.safetensors"),
                str(workspace / "data"),
                "--out",
                str(tmp_path / "x"),
                "--samples",
                "100000",
                "--tokenizer",
                str(workspace / "tokenizer.json"),
            ]
        )
        == 2
    )
    assert f"{workspace / 'data'} holds" in capsys.readouterr().err
