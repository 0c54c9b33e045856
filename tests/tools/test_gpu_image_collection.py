"""Every test module collects on the GPU image, whose packages differ from this venv's
(no wandb, nbformat or zstandard there): pytest collects the whole suite here under
tests/helpers.gpu_image_site, which leaves out what the image lacks, so a module-level import
of a missing package fails here and not in a device call."""

import os
import subprocess
import sys

from tests.helpers import gpu_image_site

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_every_test_module_collects_without_the_packages_the_gpu_image_lacks(tmp_path):
    site = gpu_image_site(tmp_path)
    assert not (site / "wandb").exists() and not (site / "nbformat").exists() and not (site / "zstandard").exists()
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(site), os.path.join(REPOSITORY, "src"), REPOSITORY]),
        PYTEST_DISABLE_PLUGIN_AUTOLOAD="1",  # the image has its own plugins; collection needs none
        OMP_NUM_THREADS="1",
    )
    command = [sys.executable, "-S", "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "tests"]
    collected = subprocess.run(command, cwd=REPOSITORY, env=env, capture_output=True, text=True, check=False)
    errors = [line for line in collected.stdout.splitlines() if line.startswith(("ERROR", "E  "))]
    assert collected.returncode == 0 and not errors, "\n".join(errors) or collected.stdout[-3000:] + collected.stderr
