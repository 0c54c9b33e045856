"""Effective-length search: Wilson intervals, oracle / silent / last-K readers over cells,
heatmap, a real Llama decoded by the engine against the recompute reference."""

import json
import re

import numpy as np
import pytest
import torch

from longctx.config import EvalConfig, ExperimentConfig, NiahConfig
from longctx.config.model import ModelConfig
from longctx.config.position_methods import PositionMethodConfig, StringConfig
from longctx.eval import cell_decoding
from longctx.eval.cell_records import read_records
from longctx.eval.cells import Cell, CellResult, Decoding, summarize
from longctx.eval.effective_length import plot_heatmap, search_effective_length
from longctx.eval.errors import PromptTooShortError
from longctx.eval.niah.engine_task import NiahTask, check_task_settings
from longctx.eval.niah.evaluation import evaluate
from longctx.eval.niah.generator import make_samples
from longctx.eval.stats import wilson_interval
from longctx.model.inference.generation import Generation
from longctx.model.inference.prefill import greedy_generate_recompute
from longctx.model.llama import Llama
from longctx.model.position_methods import build_position_method


class LastKReader:
    """Answers every 6-digit number it can read in the last `window` prompt tokens, then EOS."""

    def __init__(self, tokenizer, window: int):
        self.tokenizer, self.window = tokenizer, window

    def generate(self, input_ids, max_new_tokens):
        rows = []
        for row in input_ids.tolist():
            visible = self.tokenizer.decode(row[max(0, len(row) - self.window) :])
            numbers = re.findall(r"(?<!\d)\d{6}(?!\d)", visible)
            ids = self.tokenizer.encode(" " + ", ".join(numbers) + ".")[:max_new_tokens]
            rows.append(ids + [self.tokenizer.eos_id] * (max_new_tokens - len(ids)))
        return torch.tensor(rows)


def oracle_search(reader, tokenizer, haystack, cfg):
    """The search over cells whose outputs come from `reader.generate(ids [1, T], n)` (cut at
    EOS), scored by the NIAH task as the engine scores a decoded sample."""
    task = NiahTask(cfg, haystack)

    def run_length(length):
        records = []
        for sample in task.samples(cfg.seed, length, cfg.tests_per_length, tokenizer):
            ids = reader.generate(torch.tensor([sample.prompt_ids]), cfg.max_new_tokens)[0].tolist()
            ids = ids[: ids.index(tokenizer.eos_id)] if tokenizer.eos_id in ids else ids
            generation = Generation(ids, tokenizer.decode(ids), "eos")
            score = task.score(sample, generation)
            records.append(
                {"index": sample.index, "text": generation.text, "score": score, **task.details(sample, generation)}
            )
        return CellResult(Cell("oracle", "rope", task.name, length), records, summarize(records))

    return search_effective_length(run_length, cfg)


def config(**changes):
    values = dict(step=128, max_length=1024, tests_per_length=8, depth_bands=4, seed=5)
    return NiahConfig(**{**values, **changes})


def expected_from_spans(tokenizer, haystack, cfg, window):
    """Brute force from the samples' metadata: an answer is read iff its digits start in the window."""
    effective, rates, cells = 0, [], []
    for length in cfg.evaluated_lengths():
        samples = make_samples(tokenizer, haystack, length, cfg.tests_per_length, task=cfg.task, seed=cfg.seed)
        seen = [[n.value_span[0] >= length - window for n in s.answer_needles] for s in samples]
        rate = np.mean([sum(v) >= (cfg.min_found or 2) for v in seen])
        rates.append(rate)
        depth = np.array([n.depth for s in samples for n in s.answer_needles])
        hits = np.array([h for v in seen for h in v])
        band = np.minimum((depth * cfg.depth_bands).astype(int), cfg.depth_bands - 1)
        cells.append([hits[band == b].mean() if (band == b).any() else np.nan for b in range(cfg.depth_bands)])
        if rate < cfg.pass_threshold:
            break
        effective = length
    return effective, rates, np.array(cells).T


# --------------------------------------------------------------------------- Wilson


def test_wilson_interval_hand_worked():
    # 8 of 10, z = 1.96: centre (0.8 + 0.19208) / 1.38416 = 0.716738,
    # half 1.96 / 1.38416 * sqrt(0.016 + 0.009604) = 0.226583.
    low, high = wilson_interval(8, 10)
    assert low == pytest.approx(0.490155, abs=1e-5) and high == pytest.approx(0.943321, abs=1e-5)
    # k = 0 has the closed form [0, z^2 / (n + z^2)]; k = n mirrors it.
    assert wilson_interval(0, 10) == pytest.approx((0.0, 3.8416 / 13.8416))
    assert wilson_interval(10, 10) == pytest.approx((1 - 3.8416 / 13.8416, 1.0))
    # the paper's 500 tests: 250 passes is known to about +-0.044
    low, high = wilson_interval(250, 500)
    assert (high - low) / 2 == pytest.approx(0.0436, abs=5e-4)
    with pytest.raises(ValueError, match="successes <= trials"):
        wilson_interval(3, 2)


# --------------------------------------------------------------------------- search logic


def test_oracle_passes_every_length(tokenizer, haystack):
    cfg = config(max_length=768)
    result = oracle_search(LastKReader(tokenizer, 10**9), tokenizer, haystack, cfg)
    assert result.effective_length == 768
    assert [r.length for r in result.per_length] == [128, 256, 384, 512, 640, 768]
    assert all(r.passed == r.tests == 8 and r.rate == 1 and r.recall == 1 for r in result.per_length)
    assert np.nanmin(result.heatmap) == 1 and np.nanmin(result.depth_recall) == 1
    assert result.per_length[0].wilson_low == pytest.approx(wilson_interval(8, 8)[0])


def test_silent_model_has_effective_length_zero(tokenizer, haystack):
    class Silent:
        def generate(self, input_ids, max_new_tokens):
            return torch.full((len(input_ids), max_new_tokens), tokenizer.eos_id)

    result = oracle_search(Silent(), tokenizer, haystack, config())
    assert result.effective_length == 0
    assert len(result.per_length) == 1 and result.per_length[0].passed == 0  # stopped at the first failure
    assert result.per_length[0].example_output == ""
    blind = oracle_search(LastKReader(tokenizer, 0), tokenizer, haystack, config())
    assert blind.effective_length == 0 and blind.per_length[0].example_output == " ."


@pytest.mark.parametrize("min_found", [None, 1, 3])
def test_last_k_reader_matches_a_brute_force_count(tokenizer, haystack, min_found):
    found = []
    for window in (64, 160, 320, 480):
        cfg = config(min_found=min_found)
        result = oracle_search(LastKReader(tokenizer, window), tokenizer, haystack, cfg)
        effective, rates, cells = expected_from_spans(tokenizer, haystack, cfg, window)
        assert result.effective_length == effective
        assert [r.rate for r in result.per_length] == pytest.approx(rates)
        np.testing.assert_allclose(result.heatmap, cells)
        found.append(effective)
    assert found == sorted(found) and found[0] < found[-1]  # grows with the window


def test_last_k_reader_effective_length_is_about_k_over_far_needle_distance(tokenizer, haystack):
    # string-repo: needle 3 of 4 (the one a 2-of-4 pass needs) lies in [0.495, 0.7425) of the
    # haystack, median 0.62. It is in the window while (1 - 0.62) H + question <= K, so the
    # effective length is near K / 0.38 and grows linearly with K.
    # Its 129-token overhead (bpe-8192) does not fit in 128 tokens: that length is skipped.
    for window in (128, 256, 384):
        cfg = config(task="string-repo", tests_per_length=16, max_length=1280)
        result = oracle_search(LastKReader(tokenizer, window), tokenizer, haystack, cfg)
        assert window / 0.38 * 0.7 <= result.effective_length <= window / 0.38 * 1.15
        assert result.skipped_lengths == [128] and result.per_length[0].length == 256
    with pytest.raises(PromptTooShortError, match="every length up to max_length=128"):
        cfg = config(task="string-repo", max_length=128)
        oracle_search(LastKReader(tokenizer, 0), tokenizer, haystack, cfg)


def test_full_grid_and_depth_profile(tokenizer, haystack):
    cfg = config(stop_at_first_failure=False, max_length=1024)
    result = oracle_search(LastKReader(tokenizer, 256), tokenizer, haystack, cfg)
    assert result.heatmap.shape == (4, 8) and len(result.per_length) == 8
    assert result.heatmap[-1, -1] > result.heatmap[0, -1]  # deep needles are read, shallow ones missed at 1024
    assert result.per_length[-1].rate < 0.5 and result.effective_length < 1024


def test_result_serialises_and_plots(tokenizer, haystack, tmp_path):
    cfg = config(max_length=512, stop_at_first_failure=False)
    result = oracle_search(LastKReader(tokenizer, 200), tokenizer, haystack, cfg)
    record = json.loads(json.dumps(result.to_dict()))
    assert record["effective_length"] == result.effective_length
    assert [row["length"] for row in record["per_length"]] == [128, 256, 384, 512]
    assert record["config"]["step"] == 128 and len(record["heatmap"]) == 4
    path = plot_heatmap(result, tmp_path / "figs" / "niah.png")
    import matplotlib.image

    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert matplotlib.image.imread(path).ndim == 3


def test_config_errors():
    with pytest.raises(ValueError, match="eval.niah.step: must be a positive integer"):
        NiahConfig(step=0)
    with pytest.raises(ValueError, match="eval.niah.max_length: 64 is below eval.niah.step=128"):
        NiahConfig(max_length=64)
    with pytest.raises(ValueError, match="eval.niah.pass_threshold"):
        NiahConfig(pass_threshold=1.5)
    with pytest.raises(ValueError, match=r"eval.niah.min_found: must be in \[1, 4\]"):
        check_task_settings(NiahConfig(min_found=5))
    with pytest.raises(ValueError, match="eval.niah.task: NIAH task 'nope' is not one of"):
        check_task_settings(NiahConfig(task="nope"))
    with pytest.raises(ValueError, match="call for_model"):
        NiahConfig().evaluated_lengths()


# --------------------------------------------------------------------------- real model


@pytest.fixture(scope="module")
def debug_llama():
    torch.manual_seed(0)
    return Llama(ModelConfig.from_preset("debug", init_std=0.2)).double().eval()


def recompute_texts(model, tokenizer, samples, new_tokens, method=None):
    """The reference decoding: every token by re-running the whole sequence, cut at EOS."""
    texts = []
    for sample in samples:
        row = greedy_generate_recompute(model, torch.from_numpy(sample.input_ids)[None], new_tokens, method)[0].tolist()
        texts.append(tokenizer.decode(row[: row.index(tokenizer.eos_id)] if tokenizer.eos_id in row else row))
    return texts


def search_records(cells_dir, length):
    [path] = cells_dir.glob(f"**/L{length}/samples.jsonl")
    return sorted(read_records(path), key=lambda record: record["index"])


def test_the_search_decodes_batches_of_cached_rows_as_the_recompute_reference(
    tokenizer, haystack, debug_llama, one_thread, tmp_path
):
    """Five tests of 160 tokens, 480 prompt tokens per forward: batches of 3 and 2."""
    assert Decoding(batch_tokens=480).rows(160) == 3
    cfg = config(lengths=[160], tests_per_length=5, max_new_tokens=10, batch_tokens=480, prefill_chunk_tokens=64)
    evaluate(debug_llama, ExperimentConfig(), tokenizer, haystack, settings=cfg, cells_dir=tmp_path)
    texts = [record["text"] for record in search_records(tmp_path, 160)]
    samples = make_samples(tokenizer, haystack, 160, 5, seed=cfg.seed)
    assert texts == recompute_texts(debug_llama, tokenizer, samples, 10)
    assert len(set(texts)) > 1  # prompts led to different continuations


def test_position_method_reaches_the_model(tokenizer, haystack, debug_llama, one_thread, tmp_path):
    cfg = config(lengths=[160], tests_per_length=2, max_new_tokens=6, seed=2)
    method = PositionMethodConfig(name="string", string=StringConfig(shift=48, local_window=8))
    settings = ExperimentConfig()
    evaluate(debug_llama, settings, tokenizer, haystack, method=method, settings=cfg, cells_dir=tmp_path / "string")
    evaluate(debug_llama, settings, tokenizer, haystack, settings=cfg, cells_dir=tmp_path / "rope")
    with_string = [record["text"] for record in search_records(tmp_path / "string", 160)]
    samples = make_samples(tokenizer, haystack, 160, 2, seed=2)
    reference = build_position_method(method, debug_llama.config)
    assert with_string == recompute_texts(debug_llama, tokenizer, samples, 6, reference)
    assert with_string != [record["text"] for record in search_records(tmp_path / "rope", 160)]


@pytest.mark.parametrize("setting", ["eager", "graph+kernel"])
def test_the_search_decodes_as_eval_cuda_decoding_says(
    setting, tokenizer, haystack, debug_llama, one_thread, tmp_path, monkeypatch
):
    """`longctx niah` and the in-training probe (both `evaluate`) hand eval.cuda_decoding to
    every `generate` call (eager by default)."""
    seen = []
    generate = cell_decoding.generate

    def spied(model, prompts, **options):
        seen.append(options["cuda_decoding"])
        return generate(model, prompts, **options)

    monkeypatch.setattr(cell_decoding, "generate", spied)
    cfg = config(lengths=[128], tests_per_length=2, max_new_tokens=2)
    experiment = ExperimentConfig(eval=EvalConfig(cuda_decoding=setting)) if setting != "eager" else ExperimentConfig()
    evaluate(debug_llama, experiment, tokenizer, haystack, settings=cfg, cells_dir=tmp_path)
    assert seen and set(seen) == {setting}


def test_rows_per_batch_respects_both_caps():
    decoding = Decoding(batch_size=64, batch_tokens=8192)
    assert [decoding.rows(n) for n in (64, 128, 1024, 3000, 9000)] == [64, 64, 8, 2, 1]


def test_search_runs_a_real_llama(tokenizer, haystack, debug_llama, one_thread, tmp_path):
    cfg = config(max_length=256, tests_per_length=3, max_new_tokens=8, stop_at_first_failure=False)
    result = evaluate(debug_llama, ExperimentConfig(), tokenizer, haystack, settings=cfg)
    assert [r.length for r in result.per_length] == [128, 256]
    assert all(0 <= r.rate <= 1 and r.tests == 3 for r in result.per_length)
    assert plot_heatmap(result, tmp_path / "llama.png").is_file()


def test_the_search_runs_any_engine_task_rulers_among_them(tokenizer, debug_llama, one_thread, tmp_path):
    """eval.niah.task=ruler-niah_single_1: RULER's own prompts and scorer, one cell per length."""
    pytest.importorskip("wonderwords")
    cfg = config(task="ruler-niah_single_1", lengths=[256, 384], tests_per_length=2)
    result = evaluate(debug_llama, ExperimentConfig(), tokenizer, None, settings=cfg, cells_dir=tmp_path)
    assert [r.length for r in result.per_length] == [256, 384] and all(r.tests == 2 for r in result.per_length)
    records = search_records(tmp_path, 256)
    assert all("pred" in r and len(r["outputs"]) == 1 for r in records)
    assert sorted(p.name for p in tmp_path.glob("model/rope/*/L*")) == ["L256", "L384"]
    assert {p.name for p in tmp_path.glob("model/rope/*")} == {"ruler-niah_single_1"}
