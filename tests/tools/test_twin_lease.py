"""tools/twin/lease.py and tools/lender.py: the twin's lease (call budget, max_steps cuts,
archive size) and the lender's terms load only when whole and consistent; a seed's archive
is kept under the lease's limit by dropping the earlier f(i) arrays first, then refused."""

import pytest
import yaml

from longctx_replication.seed_archive import SeedArchiveError, read_manifest, write_seed_archive
from tests.replication.helpers import fi_run
from tests.tools.helpers import TOOLS, lender, twin

lease = twin("lease")


def test_the_twin_s_f_i_arrays_at_full_size_fit_the_lease_s_archive_limit(tmp_path):
    root = tmp_path / "runs"
    runs = [fi_run(root, window, [300, 600, 900, 1200]) for window in (1024, 2048, 4096)]
    limit = lease.load_lease().archive_max_bytes
    manifest = lease.fit_seed_archive(root, runs, tmp_path / "seed-10.tar.xz", {"seed": 10}, limit)
    assert manifest["bytes"] <= limit and manifest["left_out"] == [] and len(manifest["files"]) == 3 * 5


def test_over_the_limit_the_earlier_f_i_arrays_go_first_then_an_error(tmp_path):
    root = tmp_path / "runs"
    runs = [fi_run(root, 4096, [300, 600, 900, 1200])]
    full = write_seed_archive(root, runs, tmp_path / "full.tar.xz", {"seed": 10})
    last = lease.fit_seed_archive(
        root, runs, tmp_path / "last.tar.xz", {"seed": 10}, max_bytes=full["bytes"] - 1
    )  # one byte too few for everything: every run keeps its last f(i) only
    fi = "pretrain/w4096_s10/fi/fi-step-"
    assert last["left_out"] == [f"{fi}{s:07d}.npz" for s in (300, 600, 900)]
    assert read_manifest(tmp_path / "last.tar.xz")["files"] == [f"{fi}0001200.npz", "pretrain/w4096_s10/metrics.jsonl"]
    same = lease.fit_seed_archive(root, runs, tmp_path / "same.tar.xz", {"seed": 10}, max_bytes=full["bytes"])
    assert same["left_out"] == [] and same["bytes"] == full["bytes"]  # at the limit nothing is dropped
    with pytest.raises(SeedArchiveError, match="over the 1,000-byte limit"):
        lease.fit_seed_archive(root, runs, tmp_path / "none.tar.xz", {"seed": 10}, max_bytes=1000)
    assert not (tmp_path / "none.tar.xz").exists() and not list(tmp_path.glob("none*"))


def test_the_committed_leases_load(tmp_path):
    for name in ("lease.yaml", "lease_smoke.yaml"):
        budget = lease.load_lease(TOOLS / "twin" / name)
        assert budget.budget_s > 0 and budget.archive_max_bytes > 0 and budget.max_steps_cuts


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"budget_s": 10, "max_steps_cuts": [5, 5], "archive_max_bytes": 1}, "strictly decreasing"),
        ({"budget_s": 10, "max_steps_cuts": [6, 5]}, r"missing keys \['archive_max_bytes'\]"),
        ({"budget_s": 10, "max_steps_cuts": [6], "archive_max_bytes": 1, "seeds": [1]}, r"unknown keys \['seeds'\]"),
        ({"budget_s": 0, "max_steps_cuts": [6], "archive_max_bytes": 1}, "must be > 0"),
    ],
)
def test_a_bad_lease_is_an_error_naming_the_file(tmp_path, body, message):
    path = tmp_path / "bad_lease.yaml"
    path.write_text(yaml.safe_dump(body))
    with pytest.raises(lease.LeaseError, match=message) as caught:
        lease.load_lease(path)
    assert "bad_lease.yaml" in str(caught.value)


def test_the_cut_in_force_moves_past_each_recorded_too_long_cut(tmp_path):
    budget = lease.Lease(budget_s=60.0, max_steps_cuts=(30, 20, 10), archive_max_bytes=1)
    assert lease.cut_in_force(budget, tmp_path) == 30
    lease.record_too_long(tmp_path, 30, {"seed": 1})
    lease.record_too_long(tmp_path, 20, {"seed": 1})
    assert lease.too_long_cuts(tmp_path) == {"30": {"seed": 1}, "20": {"seed": 1}}
    assert lease.cut_in_force(budget, tmp_path) == 10
    lease.record_too_long(tmp_path, 10, {"seed": 1})
    assert lease.cut_in_force(budget, tmp_path) is None


def test_the_lender_s_terms_load_and_a_bad_file_names_its_key(tmp_path):
    module = lender()
    terms = module.load()
    assert terms.step_s <= terms.command_s <= terms.session_s
    path = tmp_path / "lender.toml"
    good = (TOOLS / "lender.toml").read_text()
    path.write_text(good + "gpus = 1\n")
    with pytest.raises(ValueError, match=r"lender.toml: unknown keys \['gpus'\]"):
        module.load(path)
    path.write_text(good.replace("file_mib = 16", "file_mib = -1"))
    with pytest.raises(ValueError, match="file_mib must be a positive integer"):
        module.load(path)
    path.write_text(good.replace("step_s = 540", "step_s = 601"))
    with pytest.raises(ValueError, match="step_s 601 is over command_s 600"):
        module.load(path)
