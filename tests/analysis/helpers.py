"""Shared helpers of the analysis tests: running a notebook top to bottom and counting what it drew."""

from pathlib import Path

import pytest

# Not on the GPU image: the modules that use these helpers skip there instead of failing to collect.
nbformat = pytest.importorskip("nbformat", reason="nbformat is not installed (the `dev` extra has it)")
NotebookClient = pytest.importorskip("nbclient", reason="nbclient is not installed").NotebookClient

REPOSITORY = Path(__file__).resolve().parents[2]


def execute(name: str) -> nbformat.NotebookNode:
    notebook = nbformat.read(REPOSITORY / "analysis" / name, as_version=4)
    # Raises CellExecutionError (with the cell and its traceback) when any cell fails.
    NotebookClient(
        notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(REPOSITORY)}}
    ).execute()
    return notebook


def images(notebook) -> int:
    return sum("image/png" in output.get("data", {}) for cell in notebook.cells for output in cell.get("outputs", []))


def pngs(directory: Path) -> dict[str, int]:
    return {path.name: path.stat().st_size for path in directory.glob("*.png")}
