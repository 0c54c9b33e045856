"""Fixtures of the NIAH tests."""

import itertools

import pytest

from longctx.data.corpus import embedded_documents


@pytest.fixture(scope="module")
def haystack_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("hay") / "haystack.txt"
    path.write_text("\n".join(doc.text for doc in itertools.islice(embedded_documents(("prose",)), 30)))
    return path
