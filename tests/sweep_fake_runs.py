"""A stand-in for `longctx pretrain | sft | niah` in the GPU twin's driver tests: writes
what the real commands write (metrics.jsonl, niah.json, f(i) arrays, answer masking,
checkpoints and W&B files that must stay out of an archive) in the layout the report
reads (tests/replication/test_replication_report.py's synthetic runs), one metrics line per
step, FAKE_STEP_S seconds a step. SIGTERM stops it after the current step, as
`longctx pretrain` saves last.ckpt and exits. FAKE_FAIL=<substring of out_dir> makes that
job exit 3."""

import json
import os
import re
import signal
import sys
import time
from pathlib import Path

import numpy as np


def _niah(effective, lengths, passed):
    return {
        "effective_length": effective,
        "per_length": [{"length": n, "passed": passed, "tests": 50} for n in lengths],
        "depth_edges": [0.0, 0.25, 0.5, 0.75, 1.0],
        "depth_recall": [0.5, 0.9, 0.9, 0.9],
        "heatmap": [[r] * len(lengths) for r in (0.5, 0.9, 0.9, 0.9)],
        "lengths": lengths,
    }


def main(command: str, options: list[str]) -> int:
    values = dict(word.split("=", 1) for word in options if "=" in word)  # the last value of a key wins
    values = {k: re.sub(r"\$\{([^}]+)\}", lambda m: values[m.group(1)], v) for k, v in values.items()}  # as OmegaConf
    out = Path(values.get("train.out_dir") or values["eval.out_dir"])
    if os.environ.get("FAKE_FAIL") and os.environ["FAKE_FAIL"] in str(out):
        print("fake failure: a traceback would be here")
        return 3
    out.mkdir(parents=True, exist_ok=True)
    (out / "checkpoints").mkdir(exist_ok=True)
    (out / "checkpoints" / "last.ckpt").write_bytes(os.urandom(300_000))
    (out / "wandb").mkdir(exist_ok=True)
    (out / "wandb" / "run.json").write_text("{}")
    seed = int(values["train.seed"])
    if command == "niah":
        passed = {"rope": 40, "string": 45}.get(values["eval.position_method.name"], 42) + seed % 3
        (out / "niah.json").write_text(json.dumps(_niah(0, [int(values["fake.window"])], passed)))
        return 0
    if command == "sft":
        (out / "niah_after_sft").mkdir(exist_ok=True)
        effective = 768 if values["sft.variant"] == "skipalign" else 512
        (out / "niah_after_sft" / "niah.json").write_text(json.dumps(_niah(effective, [256, 512], 50)))
        return 0
    window, max_steps = int(values["data.window"]), int(values["train.max_steps"])
    steps = int(values.get("train.stop_at_step", 0)) or max_steps
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    with (out / "metrics.jsonl").open("a") as metrics:
        for step in range(1, steps + 1):
            time.sleep(float(os.environ.get("FAKE_STEP_S", "0")))
            row = {"step": step, "train/loss": 3.0 - step / max_steps, "train/tokens_seen": step * 4096}
            if step % 5 == 0 or step == steps:
                row["answers/loss"] = 2.3 - step / max_steps
                directory = out / "niah" / f"step-{step:07d}"
                directory.mkdir(parents=True, exist_ok=True)
                effective = window * step // steps
                (directory / "niah.json").write_text(json.dumps(_niah(effective, [window // 2, window], 50)))
                (directory / "niah_heatmap.png").write_bytes(b"\x89PNG")
                row |= {"niah/effective_length": effective, "niah/f_at_effective_length": 100.0 / step}
                relative = np.arange(window, 0, -1, dtype=np.int64) * 1_000_003 * step
                (out / "fi").mkdir(exist_ok=True)
                np.savez(out / "fi" / f"fi-step-{step:07d}.npz", relative=relative, absolute=relative[::-1])
            metrics.write(json.dumps(row) + "\n")
            metrics.flush()
            if stop:
                return 0
    masking = {"sources": [{"path": "short", "answers": 100, "cut": 40}]}
    (out / "answer_masking.json").write_text(json.dumps(masking))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1], sys.argv[2:]))
