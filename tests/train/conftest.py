"""Fixtures of the training tests."""

import pytest

from tests.train.helpers import make_workspace


@pytest.fixture(scope="session")
def workspace(tmp_path_factory):
    return make_workspace(tmp_path_factory.mktemp("pretrain"))
