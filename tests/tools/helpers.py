"""Helpers of the tools' tests: the tools are script folders (tools/gpu, tools/twin, tools/),
not packages, so a test imports a tool as its script sees its siblings: with the folder on
sys.path for the import, and sys.path restored after it."""

import importlib
import sys
from pathlib import Path
from types import ModuleType

REPOSITORY = Path(__file__).resolve().parents[2]
TOOLS = REPOSITORY / "tools"


def tool(folder: Path, name: str) -> ModuleType:
    """The module `name` of the script folder `folder`, imported once."""
    saved = list(sys.path)
    sys.path.insert(0, str(folder))
    try:
        return importlib.import_module(name)
    finally:
        sys.path[:] = saved


def gpu(name: str) -> ModuleType:
    """A module of tools/gpu (the checklist, its runner, staging, gpu-check, the parts)."""
    return tool(TOOLS / "gpu", name)


def twin(name: str) -> ModuleType:
    """A module of tools/twin (the GPU twin's driver and its lease)."""
    return tool(TOOLS / "twin", name)


def lender() -> ModuleType:
    """tools/lender.py: the lender's terms."""
    return tool(TOOLS, "lender")
