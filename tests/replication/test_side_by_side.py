"""longctx_replication/side_by_side.py on fake jobs: a resumable counter that saves on SIGTERM (as
`longctx pretrain` saves last.ckpt), a failing job, a blocked one and one that ignores
SIGTERM. Each call's outcome is checked against what the job itself recorded."""

import json
import sys
import time

from longctx_replication.side_by_side import Job, run_side_by_side

COUNTER = """
import json, pathlib, signal, sys, time
state, total, history = pathlib.Path(sys.argv[1]), int(sys.argv[2]), pathlib.Path(sys.argv[3])
step = json.loads(state.read_text())["step"] if state.exists() else 0
start = step
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
while step < total and not stop:
    time.sleep(0.05)
    step += 1
state.write_text(json.dumps({"step": step}))
with history.open("a") as f:
    f.write(json.dumps([start, step]) + "\\n")
"""


def _counter_job(tmp_path, total=100):
    script = tmp_path / "counter.py"
    script.write_text(COUNTER)
    out = tmp_path / "run"
    out.mkdir()
    argv = [sys.executable, str(script), str(out / "state.json"), str(total), str(out / "history.jsonl")]
    return Job("counter", argv, out), out


def _history(out):
    return [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines()]


def test_stopped_before_the_deadline_resumed_next_call_then_skipped(tmp_path):
    job, out = _counter_job(tmp_path)
    logs = tmp_path / "logs"
    first = run_side_by_side([job], time.monotonic() + 4, logs, max_parallel=1, stop_before_s=2.5, min_start_s=0)
    assert [o.state for o in first] == ["stopped"]
    ((start, saved),) = _history(out)
    assert start == 0 and 0 < saved < 100  # saved mid-way on SIGTERM
    assert not job.done

    second = run_side_by_side([job], time.monotonic() + 60, logs, max_parallel=1, min_start_s=0)
    assert [(o.state, o.returncode) for o in second] == [("done", 0)]
    assert _history(out)[1] == [saved, 100]  # continued from the saved step, not from 0
    assert job.done and json.loads(job.done_marker.read_text())["argv"] == job.argv

    third = run_side_by_side([job], time.monotonic() + 60, logs, max_parallel=1, min_start_s=0)
    assert [o.state for o in third] == ["skipped"]
    assert len(_history(out)) == 2  # not run again
    assert (logs / "counter.log").read_text().count("=== ") == 2  # one header per start, appended


def test_failed_blocked_and_pending_jobs_are_told_apart(tmp_path):
    fail = Job("fail", [sys.executable, "-c", "import sys; sys.exit(3)"], tmp_path / "fail")
    blocked = Job("blocked", [sys.executable, "-c", "pass"], tmp_path / "blocked", needs=(tmp_path / "base.ckpt",))
    outcomes = run_side_by_side(
        [fail, blocked], time.monotonic() + 60, tmp_path / "logs", max_parallel=2, min_start_s=0
    )
    assert [(o.state, o.returncode) for o in outcomes] == [("failed", 3), ("blocked", None)]
    assert outcomes[1].missing == [str(tmp_path / "base.ckpt")]
    assert not fail.done

    late = Job("late", [sys.executable, "-c", "pass"], tmp_path / "late")
    (pending,) = run_side_by_side([late], time.monotonic() + 10, tmp_path / "logs", max_parallel=1, min_start_s=30)
    assert pending.state == "pending" and not (tmp_path / "logs" / "late.log").exists()


def test_a_job_that_ignores_sigterm_is_killed_at_the_deadline(tmp_path):
    stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
    job = Job("stubborn", [sys.executable, "-c", stubborn], tmp_path / "stubborn")
    started = time.monotonic()
    (outcome,) = run_side_by_side([job], started + 3, tmp_path / "logs", max_parallel=1, stop_before_s=1, min_start_s=0)
    assert outcome.state == "stopped" and outcome.returncode == -9
    assert time.monotonic() - started < 10


def test_at_most_max_parallel_jobs_run_at_once(tmp_path):
    # Each job appends its start and end time; with 2 slots no three intervals overlap.
    record = tmp_path / "times.jsonl"
    code = f"import json, time; s = time.time(); time.sleep(0.5); open({str(record)!r}, 'a').write(json.dumps([s, time.time()]) + '\\n')"
    jobs = [Job(f"j{i}", [sys.executable, "-c", code], tmp_path / f"j{i}") for i in range(4)]
    outcomes = run_side_by_side(jobs, time.monotonic() + 60, tmp_path / "logs", max_parallel=2, min_start_s=0)
    assert [o.state for o in outcomes] == ["done"] * 4
    spans = [json.loads(line) for line in record.read_text().splitlines()]
    for start, _ in spans:
        assert sum(s <= start < e for s, e in spans) <= 2
