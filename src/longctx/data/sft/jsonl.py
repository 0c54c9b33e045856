"""Reading Tulu-v2 chat JSONL (SkipAlign §4, docs/design.md §11).

One conversation per line: {"messages": [{"role": "system" | "user" | "assistant",
"content": "..."}, ...]} (other keys are ignored, blank lines too). A line that is not
JSON, not such an object, has an unknown role, an empty or non-string content or no
assistant turn is reported with its 1-based line number and skipped
(`on_bad_sample="skip"`) or fails the load (`"error"`); the count is logged.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from longctx.errors import DataError

CHAT_ROLES = ("system", "user", "assistant")
ON_BAD_SAMPLE = ("skip", "error")
EMBEDDED = "embedded"
"""The source name of the generated default set (see data/sft/synthetic.py)."""


class SFTDataError(DataError):
    """An SFT source cannot be read or yields no usable sample."""


@dataclass
class SFTReport:
    """What loading an SFT source kept and dropped."""

    source: str
    """The path read, or a description of the embedded set."""
    conversations: int = 0
    """Well-formed conversations read."""
    bad: list[tuple[int, str]] = field(default_factory=list)
    """(1-based line number, reason) of every malformed line skipped."""
    truncated: int = 0
    """Samples cut to max_sample_length tokens."""
    without_labels: int = 0
    """Samples dropped because no response token was left after truncation."""
    samples: int = 0
    """Samples kept."""

    def summary(self) -> str:
        return (
            f"{self.source}: {self.samples} samples from {self.conversations} conversations; "
            f"{len(self.bad)} malformed lines skipped, {self.truncated} truncated, "
            f"{self.without_labels} dropped without a response token"
        )


def conversation_problem(record: object) -> str | None:
    """Why a decoded JSONL record is not a usable conversation, or None if it is one."""
    if not isinstance(record, dict) or not isinstance(record.get("messages"), list):
        return "expected an object with a 'messages' list"
    for index, message in enumerate(record["messages"]):
        if not isinstance(message, dict):
            return f"messages[{index}] is not an object"
        role, content = message.get("role"), message.get("content")
        if role not in CHAT_ROLES:
            return f"messages[{index}] has unknown role {role!r} (expected one of {CHAT_ROLES})"
        if not isinstance(content, str) or not content.strip():
            return f"messages[{index}] ({role}) has empty content"
    if not any(message["role"] == "assistant" for message in record["messages"]):
        return "no assistant turn"
    return None


def read_conversations(path: str | Path, on_bad_sample: str, report: SFTReport) -> list[list[dict]]:
    """The message lists of a Tulu-v2 JSONL file; malformed lines go to `report.bad` or raise."""
    if on_bad_sample not in ON_BAD_SAMPLE:
        raise ValueError(f"on_bad_sample must be one of {ON_BAD_SAMPLE}, got {on_bad_sample!r}")
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"SFT data {str(path)!r} is not a file (give a JSONL path or {EMBEDDED!r})")
    conversations: list[list[dict]] = []
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            problem: str | None
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                problem = f"bad JSON ({err.msg} at column {err.colno})"
            else:
                problem = conversation_problem(record)
            if problem is None:
                conversations.append(record["messages"])
            elif on_bad_sample == "error":
                raise SFTDataError(f"{path}:{number}: {problem} (set on_bad_sample=skip to skip such lines)")
            else:
                report.bad.append((number, problem))
    report.conversations = len(conversations)
    return conversations
