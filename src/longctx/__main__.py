"""`python -m longctx ...` (what torchrun and W&B sweeps launch) is the `longctx` CLI."""

import sys

from longctx.cli import main

sys.exit(main())
