"""Small builders shared by tests."""

import itertools
import json
from pathlib import Path

import torch


def packed_document_ids(lengths: list[int], batch: int = 1) -> torch.Tensor:
    """[batch, sum(lengths)] ids 0, 0, ..., 1, 1, ... for documents of the given lengths."""
    ids = torch.cat([torch.full((n,), i, dtype=torch.long) for i, n in enumerate(lengths)])
    return ids.expand(batch, -1).clone()


def reset_position_ids(lengths: list[int], batch: int = 1) -> torch.Tensor:
    """Positions restarting at 0 in every document."""
    ids = torch.cat([torch.arange(n) for n in lengths])
    return ids.expand(batch, -1).clone()


def wandb_grid(sweep: dict) -> list[list[str]]:
    """The `key=value` argument lists W&B's ${args_no_hyphens} produces for a grid sweep:
    W&B's engine sorts the parameter names, and the last one varies fastest."""
    names, choices = [], []
    for name in sorted(sweep["parameters"]):
        spec = sweep["parameters"][name]
        names.append(name)
        choices.append(spec["values"] if "values" in spec else [spec["value"]])
    return [
        [f"{n}={str(v).lower() if isinstance(v, bool) else v}" for n, v in zip(names, combo, strict=True)]
        for combo in itertools.product(*choices)
    ]


def read_verdicts(path: str | Path) -> dict[str, str]:
    """{finding key: verdict} of a replication summary JSON (longctx_replication.findings.write_summary)."""
    return {key: value["verdict"] for key, value in json.loads(Path(path).read_text())["findings"].items()}


def gpu_image_environment(scratch: Path) -> dict[str, str]:
    """os.environ for a subprocess that should see what the GPU image lacks: `wandb` (not in
    the image, not staged by prepare-device.sh) raises ImportError on import, as it would
    there, so a GPU script that imports it when W&B is disabled fails here, not in a device call.
    One OpenMP thread, as every test subprocess beside the pytest workers."""
    import os
    import sys

    stub = scratch / "gpu_image_stubs" / "wandb"
    stub.mkdir(parents=True, exist_ok=True)
    (stub / "__init__.py").write_text('raise ImportError("wandb is not installed on the GPU image")\n')
    path = os.pathsep.join([str(stub.parent), *sys.path])
    return dict(os.environ, PYTHONPATH=path, OMP_NUM_THREADS="1")


GPU_IMAGE_STAGED_SETS = ("base", "hf")
"""What stands in for the image's own packages besides image.txt: `base` is carried to every
device call; `hf` holds what this venv's transformers (the pinned one) needs beyond the image's
older transformers, so that the venv's copy imports as the image's own does there."""


def gpu_image_site(scratch: Path) -> Path:
    """A site-packages of links to this venv's, less every distribution that neither the GPU
    image (tools/gpu/staging/image.txt) nor GPU_IMAGE_STAGED_SETS provides: run a python
    with `-S` (no site) and this directory on PYTHONPATH to import as on the image, where a
    missing package raises ModuleNotFoundError and `importlib.util.find_spec` finds nothing.
    A top-level directory shared with a kept distribution (a namespace package) stays."""
    import importlib.metadata
    import os
    import sys

    from packaging.utils import canonicalize_name

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools" / "gpu"))
    try:
        import staging
    finally:
        sys.path.pop(0)
    provided = set(staging.load_image())
    for name in GPU_IMAGE_STAGED_SETS:
        provided |= {wheel.name for wheel in staging.read_lock(staging.lock_path(name))}
    dropped, kept = set(), set()
    for distribution in importlib.metadata.distributions():
        tops = {file.parts[0] for file in distribution.files or []}
        (kept if canonicalize_name(distribution.metadata["Name"]) in provided else dropped).update(tops)
    site = Path(importlib.metadata.distribution("torch").locate_file(""))
    target = scratch / "gpu_image_site"
    target.mkdir(parents=True)
    for entry in site.iterdir():
        if entry.name not in dropped - kept and entry.suffix != ".pth":
            os.symlink(entry, target / entry.name)
    return target
