"""The main job, composed as users run it (docs/composition.md): the fsdp pretrain with
f(i) and NIAH on 2 gloo ranks, and SkipAlign SFT under fsdp with NIAH after it (~3 min of
one worker). The whole
matrix is tests/composition/test_matrix.py (`make test-slow`)."""

import numpy as np
import pytest

from tests.composition import helpers
from tests.composition.helpers import BY_NAME


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """The one-process pretrain/tiny_512 cell: its f(i) and its checkpoint (SFT's init)."""
    out = tmp_path_factory.mktemp("cells") / "single"
    output = helpers.run(BY_NAME["pretrain/tiny_512"], "single", out)
    helpers.check_probes(BY_NAME["pretrain/tiny_512"], "single", out, output)
    return out


def test_fsdp_pretrain_with_niah_matches_one_process(pretrained, tmp_path):
    """(Kill and resume of this cell: the matrix, tests/composition/test_matrix.py.)"""
    config = BY_NAME["pretrain/tiny_512"]
    out = tmp_path / "fsdp"
    output = helpers.run(config, "fsdp", out)
    helpers.check_probes(config, "fsdp", out, output)
    # f(i) counts the rows consumed: two ranks consume one process's rows
    for name, counts in helpers.final_fi(pretrained).items():
        np.testing.assert_array_equal(helpers.final_fi(out)[name], counts, err_msg=name)
    helpers.check_sharded_niah(config, "fsdp", out, None, tmp_path / "niah")


def test_skipalign_sft_under_fsdp_with_niah_after(pretrained, tmp_path):
    config = BY_NAME["sft/tiny_skipalign"]
    init = pretrained / "checkpoints" / "last.ckpt"
    out = tmp_path / "fsdp"
    output = helpers.run(config, "fsdp", out, init=init)
    fired = helpers.check_probes(config, "fsdp", out, output)
    assert fired["niah_after"] == (1, 1)
    helpers.check_sharded_niah(config, "fsdp", out, init, tmp_path / "niah")
