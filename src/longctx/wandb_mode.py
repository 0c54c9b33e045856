"""Whether W&B runs online: one rule for every command that logs (training, `longctx niah`).

`auto` goes online only when an API key is available (WANDB_API_KEY or a `~/.netrc` entry
for api.wandb.ai), so W&B never prompts for a login and offline is the default. This
module imports nothing of the suite, so every layer may use it.
"""

from __future__ import annotations

import netrc
import os


def wandb_key_configured() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (FileNotFoundError, netrc.NetrcParseError):
        return False


def resolve_wandb_mode(mode: str) -> str:
    if mode == "auto":
        return "online" if wandb_key_configured() else "offline"
    return mode
