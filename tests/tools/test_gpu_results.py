"""GPU tables in the docs are the result files themselves (tools/gpu/gpu_results.py)."""

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SAVED_PATH = list(sys.path)
sys.path.insert(0, str(ROOT / "tools" / "gpu"))
import gpu_results  # noqa: E402  (a script directory, not a package)

sys.path[:] = SAVED_PATH


@pytest.mark.parametrize("doc", ["docs/benchmarks.md", "docs/designs.md"])
def test_every_gpu_block_in_the_docs_equals_its_result_file(doc):
    before, after = gpu_results.sync(ROOT / doc)
    assert "<!-- gpu-table " in before
    assert before == after, f"{doc} differs from its result files: python tools/gpu/gpu_results.py sync {doc}"


def write_table(directory: Path, name: str, columns: list[str], rows: list[list[str]]) -> None:
    (directory / f"{name}.json").write_text(json.dumps({"name": name, "columns": columns, "rows": rows}))


def test_targets_read_each_row_and_the_first_of_a_repeated_column(tmp_path):
    columns = ["T", "method", "prefill ms", "vs rope", "decode ms/token", "vs rope"]
    write_table(
        tmp_path,
        "positions_tinyllama-1.1b",
        columns,
        [["32768", "rope", "1", "", "1", ""], ["32768", "string", "2", "1.31x", "3", "1.10x"]],
    )
    columns = ["T", "impl", "MFU", "vs HF", "peak GiB", "estimate GiB"]
    write_table(tmp_path, "train_step", columns, [["2048", "longctx flash", "50.0%", "1.49x", "40.0", "48.0"]])
    rows = gpu_results.target_rows(tmp_path)
    assert [row[2:] for row in rows] == [["50.0%", "met"], ["1.49x", "missed"], ["1.31x", "missed"], ["1.20x", "met"]]
    assert rows[2][1] == "positions_tinyllama-1.1b: 32768 string"


def test_a_block_naming_a_missing_file_says_which(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("<!-- gpu-table docs/gpu-results/none/x.md -->\n<!-- /gpu-table -->\n")
    with pytest.raises(FileNotFoundError, match=r"docs/gpu-results/none/x\.md: no such result file"):
        gpu_results.sync(doc)


def test_a_targets_block_names_the_device_torch_cuda_and_commit_it_was_measured_on():
    """A target is met only by a GPU row: the block says which GPU, torch and commit."""
    run = ROOT / "docs" / "gpu-results" / "h100-2026-11-27" / "run1"
    first = gpu_results.render_targets(run).splitlines()[0]
    assert first == "measured on NVIDIA H100 80GB HBM3, torch 2.11.0+cu130, CUDA 13.0, commit 8087401"
    h200 = gpu_results.provenance(ROOT / "docs" / "gpu-results" / "h200-2026-11-27" / "gpu-check")
    assert h200.endswith("torch 2.11.0+cu130, CUDA 13.0, commit 843f4ed") and "H200" in h200


def test_a_folder_without_tables_or_a_record_says_so(tmp_path):
    assert gpu_results.provenance(tmp_path) == (
        "measured on an unrecorded device, torch not recorded, CUDA not recorded, commit not recorded"
    )
