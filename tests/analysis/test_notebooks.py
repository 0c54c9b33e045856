"""The analysis notebooks run top to bottom (nbclient, the venv's python3 kernel) on the tiny
fixture run and its StRing ablation, and draw every figure they promise."""

import pytest

from tests.analysis.helpers import REPOSITORY, execute, images, nbformat, pngs

NOTEBOOKS = sorted((REPOSITORY / "analysis").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebooks_are_saved_clean_with_parameters_first(path):
    notebook = nbformat.read(path, as_version=4)
    nbformat.validate(notebook)
    assert all(
        not cell.get("outputs") and not cell.get("execution_count")
        for cell in notebook.cells
        if cell.cell_type == "code"
    )
    first = notebook.cells[0]
    assert first.cell_type == "code" and 'os.environ.get("LONGCTX_' in first.source
    assert notebook.metadata.kernelspec.name == "python3"


def test_string_figures_notebook(fixture_run, tmp_path, monkeypatch):
    monkeypatch.setenv("LONGCTX_RUNS", str(fixture_run.run.parent / "*"))
    monkeypatch.setenv("LONGCTX_FIGURES", str(tmp_path))
    monkeypatch.setenv("LONGCTX_DATA", str(fixture_run.workspace / "data"))
    monkeypatch.setenv("LONGCTX_WINDOW", "256")
    notebook = execute("string_figures.ipynb")
    written = pngs(tmp_path)
    expected = {"loss.png", "fi_growth.png", "fi.png", "fig2a.png", "fig2b.png", "fig4_tiny.png", "fig1.png"}
    assert set(written) == expected
    assert all(size > 10_000 for size in written.values()), written
    assert images(notebook) == len(expected)
    frames = [o for c in notebook.cells for o in c.get("outputs", []) if "text/html" in o.get("data", {})]
    assert any("niah/effective_length" in o["data"]["text/html"] for o in frames)


def test_string_ablation_notebook(fixture_run, tmp_path, monkeypatch):
    monkeypatch.setenv("LONGCTX_NIAH", f"{fixture_run.ablation / 'fixture'},{fixture_run.run}")
    monkeypatch.setenv("LONGCTX_NIAH_WANDB", str(fixture_run.wandb_eval))
    monkeypatch.setenv("LONGCTX_FIGURES", str(tmp_path))
    notebook = execute("string_ablation.ipynb")
    written = pngs(tmp_path)
    expected = {
        f"fig7_{run}_{value}.png" for run in ("fixture", "fixture-wandb") for value in ("effective_length", "accuracy")
    }
    assert set(written) == expected
    assert all(size > 10_000 for size in written.values()), written
    assert images(notebook) == len(expected)
    markdown = [
        o["data"]["text/markdown"]
        for c in notebook.cells
        for o in c.get("outputs", [])
        if "text/markdown" in o.get("data", {})
    ]
    assert markdown and markdown[-1].splitlines()[0] == "| method | fixture | fixture-wandb |"
    assert "| string (local_window=16, shift_ratio=0.5) | 0.0 | nan |" in markdown[-1].splitlines()
