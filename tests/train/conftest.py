"""Fixtures of the training tests."""

import pytest

from longctx.gpu_checks import prepared_workspace


@pytest.fixture(scope="session")
def workspace(tmp_path_factory):
    return prepared_workspace(tmp_path_factory.mktemp("pretrain"))
