"""Shared test setup: one intra-op thread, deterministic seeds and the `gpu` marker's skip."""

import pytest
import torch

# The tests' models are tiny: a second intra-op thread costs more in hand-offs than it
# gains, and on a shared 2-core machine spinning OpenMP threads slow every small op down
# (tests/model/test_hf_variants.py -k single: 22 s on one thread, 68 s on two, beside two
# training runs). Subprocesses that need one thread set OMP_NUM_THREADS themselves.
torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def tokenizer():
    """The default bpe-8192 tokenizer (trained once per machine, then cached)."""
    from longctx.data.tokenizer import load_tokenizer

    return load_tokenizer("bpe-8192")


@pytest.fixture(scope="session")
def haystack(tokenizer):
    """The Paul Graham essays haystack; tests that need it skip when it is not installed."""
    from longctx.eval.niah.haystack import Haystack

    try:
        return Haystack.paul_graham(tokenizer)
    except FileNotFoundError as err:
        pytest.skip(str(err))
