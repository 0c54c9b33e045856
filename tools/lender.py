"""The GPU lender's terms as the tools' settings (tools/lender.toml): one command's limit, a
session's device time, what a call carries in and what comes back.

    import lender; terms = lender.load()      # from a tools/ script (its folder on sys.path)

Every tool that sizes work to a device call (the checklist's runner, the twin's driver)
reads them here, so a change of lender is one file. A key missing or unknown, or a value
that is not a positive integer, is an error naming the file and the key.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, fields
from pathlib import Path

LENDER = Path(__file__).resolve().parent / "lender.toml"


@dataclass(frozen=True)
class Lender:
    command_s: int
    """One command's wall-clock limit, seconds."""
    step_s: int
    """What a checklist step may take of a command (the rest: start-up and transfers)."""
    session_s: int
    """One session's device time, a machine's start included, seconds."""
    carry_mib: int
    """What one call takes along, the working tree included, MiB."""
    file_mib: int
    """The largest file that comes back, MiB."""
    files_back: int
    """How many files come back from one call."""


def load(path: Path = LENDER) -> Lender:
    body = tomllib.loads(path.read_text())
    names = {field.name for field in fields(Lender)}
    unknown, missing = sorted(set(body) - names), sorted(names - set(body))
    if unknown or missing:
        raise ValueError(f"{path}: unknown keys {unknown}, missing keys {missing}")
    for key, value in body.items():
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{path}: {key} must be a positive integer, got {value!r}")
    terms = Lender(**body)
    if terms.step_s > terms.command_s:
        raise ValueError(f"{path}: step_s {terms.step_s} is over command_s {terms.command_s}")
    return terms
