"""The screen table of issue 38: hand-made run directories with known probes."""

import json

from longctx_replication.mechanism_screens import main, read_screen, screen_frame, screen_table, style_by_lever


def write_run(root, name, probes, loss=0.5, f_counts=()):
    """probes: {step: (effective_length, {length: rate})}; 4,608 tokens per step; f_counts:
    (step, f(L-1), f at L_eff) rows as the f(i) and NIAH probes log them."""
    run = root / name
    run.mkdir(parents=True)
    rows = [{"step": s, "train/tokens_seen": s * 4608} for s in probes] + [{"step": 2000, "answers/loss": loss}]
    for step, f_tail, f_leff in f_counts:
        rows += [{"step": step, "fi/f@L-1": f_tail}, {"step": step, "niah/f_at_effective_length": f_leff}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for step, (length, rates) in probes.items():
        probe = run / "niah" / f"step-{step:07d}"
        probe.mkdir(parents=True)
        per_length = [{"length": k, "rate": v} for k, v in rates.items()]
        (probe / "niah.json").write_text(json.dumps({"effective_length": length, "per_length": per_length}))
    return run


def test_a_run_short_of_its_window_that_grows_meets_the_target(tmp_path):
    run = write_run(tmp_path, "a", {200: (0, {256: 0.1}), 400: (256, {256: 0.9, 288: 0.2}), 600: (352, {256: 0.85})})
    screen = read_screen(run, 512)
    assert [p.effective_length for p in screen.curve] == [0, 256, 352]
    assert screen.last.tokens == 600 * 4608
    assert screen.short_rate(screen.last) == 0.85
    assert screen.meets_target()  # 352 <= 384, 0.85 >= 0.8, 352 > 256 (the first passing probe)


def test_targets_missed_for_each_reason(tmp_path):
    at_window = write_run(tmp_path, "w", {200: (256, {256: 1.0}), 400: (512, {256: 1.0})})
    weak = write_run(tmp_path, "weak", {200: (256, {256: 0.9}), 400: (320, {256: 0.7})})
    flat = write_run(tmp_path, "flat", {200: (320, {256: 0.9}), 400: (320, {256: 0.9})})
    assert not any(read_screen(run, 512).meets_target() for run in (at_window, weak, flat))


def test_table_lists_each_run(tmp_path, capsys):
    write_run(tmp_path, "rope4_s0", {200: (0, {256: 0.0}), 400: (288, {256: 0.96})}, loss=1.234)
    (tmp_path / "unprobed").mkdir()
    assert main([str(tmp_path), "--window", "512"]) == 0
    out = capsys.readouterr().out
    # 288 is the first passing probe itself: no growth yet, so the target is not met.
    assert "| rope4_s0 | 400 | 288 | 0.96 | 1.23 | - | - | not met | 200 (0.9M) 0, 400 (1.8M) 288 |" in out
    assert "unprobed" not in out
    assert screen_table([]).count("\n") == 1


def test_f_counts_come_from_the_last_logged_step_and_several_roots_make_one_table(tmp_path, capsys):
    f_counts = [(200, 9000.0, 50000.0), (400, 1736.0, 2500.0)]
    write_run(tmp_path / "pin1", "tail_s0", {200: (288, {256: 0.9}), 400: (512, {256: 0.88})}, f_counts=f_counts)
    write_run(tmp_path / "pin2", "base_s0", {200: (0, {256: 0.0})}, f_counts=[(200, 5.0, 7.0)])
    assert main([str(tmp_path / "pin1"), str(tmp_path / "pin2"), "--window", "512"]) == 0
    out = capsys.readouterr().out
    assert "| tail_s0 | 400 | 512 | 0.88 | 0.50 | 1,736 | 2,500 | not met |" in out
    # At chance (L_eff = 0) there is no effective length to read f at.
    assert "| base_s0 | 200 | 0 | 0.00 | 0.50 | 5 | - | not met |" in out


def test_the_figure_plots_every_probe_of_every_run(tmp_path):
    write_run(tmp_path / "runs", "a", {200: (0, {256: 0.0}), 400: (352, {256: 0.9})})
    write_run(tmp_path / "runs", "b", {200: (512, {256: 1.0})})
    frame = screen_frame([read_screen(d, 512) for d in sorted((tmp_path / "runs").iterdir())])
    assert frame.values.tolist() == [
        ["a", 200, 200 * 4608, 0],
        ["a", 400, 400 * 4608, 352],
        ["b", 200, 200 * 4608, 512],
    ]
    figure_path = tmp_path / "figs" / "screens.png"
    assert main([str(tmp_path / "runs"), "--window", "512", "--figure", str(figure_path)]) == 0
    assert figure_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_levers_seeds_share_a_colour_and_differ_in_line_style():
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots()
    for label in ("rope2.0_s0", "rope2.0_s1", "base_s0", "base_s1", "other"):
        axis.plot([0, 1], [0, 1], label=label)
    style_by_lever(axis)
    style = {line.get_label(): (line.get_color(), line.get_linestyle()) for line in axis.get_lines()}
    plt.close(figure)
    assert style["rope2.0_s0"][0] == style["rope2.0_s1"][0] != style["base_s0"][0] == style["base_s1"][0]
    assert style["rope2.0_s0"][1] == style["base_s0"][1] != style["rope2.0_s1"][1] == style["base_s1"][1]
    assert style["other"][0] not in {style["rope2.0_s0"][0], style["base_s0"][0]}
