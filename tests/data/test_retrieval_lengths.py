"""The filler count of a retrieval document: log-uniform (filler_tail 0) or a truncated power
law (filler_tail alpha > 0). References: the analytic CDFs, checked with the DKW bound, and
the documents the code generated before filler_tail existed (sha256 of their text)."""

import hashlib
import math

import numpy as np
import pytest

from longctx.config.data import RetrievalConfig
from longctx.data.retrieval import filler_count, make_document
from longctx.errors import ConfigError

DRAWS = 20_000
DKW = math.sqrt(math.log(2 / 1e-4) / (2 * DRAWS))
"""sup |empirical CDF - CDF| exceeds this with probability < 1e-4 (Dvoretzky-Kiefer-Wolfowitz)."""


def counts(config: RetrievalConfig) -> np.ndarray:
    rng = np.random.default_rng(0)
    return np.array([filler_count(config, rng) for _ in range(DRAWS)])


def pareto_cdf(k: int, low: int, high: int, alpha: float) -> float:
    """P(n <= k) with n + 1 = floor(x), x Pareto(alpha) truncated to [low + 1, high + 1)."""
    a, b, t = low + 1, high + 1, k + 2  # n <= k  <=>  x < k + 2
    if t >= b:
        return 1.0
    return (a**-alpha - t**-alpha) / (a**-alpha - b**-alpha)


def log_uniform_cdf(k: int, low: int, high: int) -> float:
    a, b, t = low + 1, high + 1, k + 2
    return 1.0 if t >= b else math.log(t / a) / math.log(b / a)


@pytest.mark.parametrize(("low", "high", "alpha"), [(0, 64, 1.0), (0, 16, 0.5), (2, 40, 1.5)])
def test_power_law_counts_follow_the_truncated_pareto(low, high, alpha):
    drawn = counts(RetrievalConfig(filler_min=low, filler_max=high, filler_tail=alpha))
    assert drawn.min() >= low and drawn.max() <= high
    gap = max(abs((drawn <= k).mean() - pareto_cdf(k, low, high, alpha)) for k in range(low, high + 1))
    assert gap < DKW


def test_log_uniform_counts_are_unchanged():
    drawn = counts(RetrievalConfig(filler_min=0, filler_max=16))
    gap = max(abs((drawn <= k).mean() - log_uniform_cdf(k, 0, 16)) for k in range(17))
    assert gap < DKW


def test_most_documents_are_short_and_long_ones_rare():
    """alpha = 1 on [0, 64]: P(n >= 32) = (1/33 - 1/65) / (1 - 1/65) = 0.01515 by hand, and
    half the documents have no filler at all: P(n = 0) = (1 - 1/2) / (1 - 1/65) = 0.5078;
    the log-uniform count on the same range gives P(n >= 32) = ln(65/33) / ln 65 = 0.1624."""
    tail = counts(RetrievalConfig(filler_min=0, filler_max=64, filler_tail=1.0))
    flat = counts(RetrievalConfig(filler_min=0, filler_max=64))
    assert (tail >= 32).mean() == pytest.approx(0.01515, abs=DKW)
    assert (tail == 0).mean() == pytest.approx(0.5078, abs=DKW)
    assert (flat >= 32).mean() == pytest.approx(0.1624, abs=DKW)


def test_default_documents_are_bitwise_the_earlier_ones():
    """The long NIAH source of cpu_base, 20 documents: the sha256 of their text as generated
    at commit 45766be, before filler_tail (the prepared-data cache stays valid)."""
    config = RetrievalConfig(
        documents=40000,
        template="niah",
        facts=4,
        queries=0,
        list_query=True,
        filler_min=0,
        filler_max=16,
        value_digits=4,
        value_digits_max=9,
        seed=1,
    )
    text = "".join(make_document(config, index).text for index in range(20))
    assert hashlib.sha256(text.encode()).hexdigest() == (
        "8c7ad3d6df138943cd03d5056e4e472e2522a16cb7aa615c1775070383508456"
    )


def test_negative_tail_is_rejected():
    with pytest.raises(ConfigError, match="filler_tail"):
        RetrievalConfig(filler_tail=-1.0).validate()


def test_cache_key_of_a_default_source_is_the_earlier_one():
    """The key hashes the settings as they were before filler_tail (so existing prepared
    caches are reused); a set tail gets a directory of its own."""
    import json
    from dataclasses import asdict

    from longctx.config.data import DataSource
    from longctx.data.dataset_sources import retrieval_dataset_dir
    from longctx.data.tokenizer import load_tokenizer

    tokenizer = load_tokenizer("bpe-512")
    source = DataSource(kind="retrieval", retrieval=RetrievalConfig(template="niah", queries=0))
    earlier = {k: v for k, v in asdict(source.retrieval).items() if k != "filler_tail"}
    key = hashlib.sha256(f"{json.dumps(earlier, sort_keys=True)}|{tokenizer.fingerprint}".encode()).hexdigest()
    assert retrieval_dataset_dir(source, tokenizer).name == f"retrieval-{key[:16]}"
    tailed = DataSource(kind="retrieval", retrieval=RetrievalConfig(template="niah", queries=0, filler_tail=1.0))
    assert retrieval_dataset_dir(tailed, tokenizer) != retrieval_dataset_dir(source, tokenizer)
