"""Dataset f(i) (STRING Eq. 2, Figure 1) against direct pair counts and closed forms."""

import json

import numpy as np
import pytest
import torch

from longctx.probes.dataset_fi import figure1_frequencies, frequency_from_lengths, packed_rows_fi, split_lengths
from longctx.probes.position_frequency import relative_position_counts
from tests.data.helpers import EOS, random_documents, write_token_dataset


def brute_force(lengths, window):
    f = np.zeros(window, dtype=np.int64)
    for n in lengths:
        for q in range(n):
            for k in range(q + 1):
                f[q - k] += 1
    return f


def test_eq2_equals_brute_force_pair_count():
    rng = np.random.default_rng(0)
    lengths = rng.integers(0, 33, size=40)
    assert np.array_equal(frequency_from_lengths(lengths, 32), brute_force(lengths, 32))


def test_eq2_equals_the_training_counter_on_packed_documents():
    lengths = [5, 17, 1, 9]
    document_ids = torch.cat([torch.full((n,), i) for i, n in enumerate(lengths)])[None]
    position_ids = torch.cat([torch.arange(n) for n in lengths])[None]
    counted = relative_position_counts(position_ids, document_ids, 32).counts.numpy()
    assert np.array_equal(frequency_from_lengths(np.array(lengths), 32), counted)


def test_splitting_keeps_every_token():
    lengths = np.array([5, 64, 65, 200, 1])
    pieces = split_lengths(lengths, 64)
    assert pieces.sum() == lengths.sum() and pieces.max() == 64
    assert sorted(pieces.tolist()) == sorted([5, 64, 64, 1, 64, 64, 64, 8, 1])


def test_figure1_closed_forms():
    L = 16
    result = figure1_frequencies(np.array([40, 3, 70, 8, 19]), L)  # 140 tokens
    i = np.arange(L)
    assert np.array_equal(result.frequency["concatenated"], (140 // L) * (L - i))
    per_length = 140 // (L * (L + 1) // 2)  # one document of each length 1..16 per 136 tokens
    assert np.array_equal(result.frequency["uniform"], per_length * (L - i) * (L - i + 1) // 2)
    lines = result.summary_lines()
    assert lines[2].startswith("concatenated: positions i <= L/2 account for")
    # concatenated: sum_{i <= 8} (16 - i) / sum_i (16 - i) = 108 / 136
    assert f"{100 * 108 / 136:.1f}%" in lines[2]


@pytest.mark.parametrize("doc_mask", [False, True])
def test_packed_rows_fi_matches_the_packing(tmp_path, doc_mask):
    docs = random_documents(30, seed=3)
    write_token_dataset(tmp_path, docs)
    window = 24
    f = packed_rows_fi(tmp_path, window, EOS, doc_mask=doc_mask)
    rows = sum(len(d) for d in docs) // (window + 1)
    if not doc_mask:
        assert np.array_equal(f, rows * (window - np.arange(window)))
    else:
        assert f[0] == rows * window  # every token attends to itself once
        assert (f <= rows * (window - np.arange(window))).all() and f[-1] < rows


def test_cli_writes_png_and_numbers(tmp_path, capsys):
    from longctx.cli import main

    docs = random_documents(30, seed=5)
    write_token_dataset(tmp_path / "data", docs)
    assert main(["fi", str(tmp_path / "data"), "--window", "32", "--out", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    assert "natural: positions i <= L/2 account for" in printed
    numbers = json.loads((tmp_path / "out" / "fi_L32.json").read_text())
    assert numbers["tokens"] == sum(len(d) for d in docs)
    assert (tmp_path / "out" / "fi_L32.png").stat().st_size > 10_000


@pytest.mark.parametrize("transform", ["pose", "randpos"])
def test_transformed_fi_equals_brute_force_on_the_same_ids(transform):
    from longctx.data.positions import pose_position_ids, randpos_position_ids
    from longctx.probes.dataset_fi import transformed_fi

    lengths = np.array([7, 30, 12])
    got = transformed_fi(lengths, 16, transform, 64, seed=5)
    rng = np.random.default_rng(5)
    expected = np.zeros(64, dtype=np.int64)
    for n in split_lengths(lengths, 16):
        ids = pose_position_ids(int(n), 64, rng) if transform == "pose" else randpos_position_ids(int(n), 64, rng)
        for q in range(len(ids)):
            for k in range(q + 1):
                expected[ids[q] - ids[k]] += 1
    assert np.array_equal(got, expected)
    assert got[16:].sum() > 0  # relative positions beyond the window


@pytest.fixture(scope="module")
def small_tokenizer(tmp_path_factory):
    import itertools

    from longctx.data.corpus import embedded_documents
    from longctx.data.tokenizer import train_bpe

    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    train_bpe([doc.text for doc in itertools.islice(embedded_documents(("prose",)), 40)], vocab_size=300, path=path)
    return str(path)


def test_fi_of_a_jsonl_stops_at_a_bad_line_as_prepare_does(tmp_path, small_tokenizer, capsys):
    """One reader and one policy for `prepare` and `fi`: a bad line stops `fi x.jsonl`, naming
    file and line; `--on-bad-input skip` skips it, counts it and prints where it was."""
    from longctx.cli import main
    from longctx.data.tokenizer import load_tokenizer

    texts = ["first document here", "second, a little longer than the first", "third"]
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(
        f"{json.dumps({'text': texts[0]})}\n{{not json\n{json.dumps({'text': texts[1]})}\n"
        f"{json.dumps({'text': texts[2]})}\n"
    )
    args = ["fi", str(corpus), "--window", "16", "--tokenizer", small_tokenizer, "--out", str(tmp_path / "out")]
    assert main(args) == 2
    assert f"{corpus}:2: bad JSON" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()

    assert main([*args, "--on-bad-input", "skip"]) == 0
    printed = capsys.readouterr().out
    assert "rejected: 1 (1 bad-json)" in printed and f"{corpus}:2: bad JSON" in printed
    tokenizer = load_tokenizer(small_tokenizer)
    numbers = json.loads((tmp_path / "out" / "fi_L16.json").read_text())
    assert numbers["tokens"] == sum(len(tokenizer.encode(text)) + 1 for text in texts)


def test_fi_counts_what_sliding_layers_train(tmp_path, small_tokenizer, capsys):
    """--sliding-window W (or a --config whose model slides) adds f_W, f below W: with
    consecutive ids a sliding layer trains no distance >= W, the full layers all of them."""
    from longctx.cli import main

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": "word " * n}) + "\n" for n in (3, 9, 14, 30)))
    out = tmp_path / "out"
    args = ["fi", str(corpus), "--window", "16", "--tokenizer", small_tokenizer, "--out", str(out)]
    assert main([*args, "--sliding-window", "4"]) == 0
    frequency = json.loads((out / "fi_L16.json").read_text())["frequency"]
    natural, sliding = np.array(frequency["natural"]), np.array(frequency["natural, sliding W=4"])
    assert np.array_equal(sliding[:4], natural[:4]) and not sliding[4:].any() and natural[4:].any()
    beyond = natural[4:].sum() / natural.sum()
    assert f"{100 * beyond:.1f}% of pairs at i >= W=4, trained by the full layers only" in capsys.readouterr().out
    config = tmp_path / "model.yaml"
    config.write_text("model:\n  global_every: 2\n  sliding_window: 8\n")
    assert main([*args, "--config", str(config)]) == 0
    assert "natural, sliding W=8" in json.loads((out / "fi_L16.json").read_text())["frequency"]
