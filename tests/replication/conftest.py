"""Fixtures of the campaign's tests."""

import pytest

from longctx.gpu_checks import prepared_workspace


@pytest.fixture(scope="session")
def workspace(tmp_path_factory):
    """A prepared tiny dataset and config for the tests that run a real `longctx pretrain`."""
    return prepared_workspace(tmp_path_factory.mktemp("pretrain"))
