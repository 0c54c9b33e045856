"""Fixtures of the evaluation-engine tests."""

from tests.niah.conftest import haystack_file  # noqa: F401  (the NIAH tests' small haystack)
