"""One line per bench run with elapsed time and ETA (bench.progress), driven by a fake clock."""

from calibkit.bench.progress import RunProgress, clock


def test_clock():
    assert [clock(s) for s in (0, 59.4, 61, 3599, 3600, 3725)] == ["0:00", "0:59", "1:01", "59:59", "1:00:00",
                                                                     "1:02:05"]


def test_lines_elapsed_and_eta():
    t = [100.0]
    lines = []
    p = RunProgress(4, write=lines.append, bar=False, now=lambda: t[0])
    assert p.eta() is None
    p.end("b/ce/0", "finished earlier; skipped")  # skipped runs cost nothing and give no ETA
    assert lines[-1] == "[1/4] b/ce/0: finished earlier; skipped | elapsed 0:00"
    t[0] += 30
    p.end("b/ls/0", "done in 30 s", seconds=30)
    # mean executed run 30 s, 2 runs left -> 60 s
    assert lines[-1] == "[2/4] b/ls/0: done in 30 s | elapsed 0:30, ETA ~1:00"
    t[0] += 90
    p.end("b/focal/0", "done in 90 s", seconds=90)
    assert p.eta() == (30 + 90) / 2 * 1
    assert lines[-1].endswith("| elapsed 2:00, ETA ~1:00")
    t[0] += 10
    p.end("b/mbls/0", "FAILED: ValueError: x", seconds=10)
    assert lines[-1] == "[4/4] b/mbls/0: FAILED: ValueError: x | elapsed 2:10"  # nothing left: no ETA
    assert len(lines) == 4  # one line per run
    p.close()


def test_bar_on_a_terminal_and_lines_above_it(capsys, monkeypatch):
    import sys

    t = [0.0]
    written = []
    p = RunProgress(2, write=written.append, bar=True, now=lambda: t[0])
    p.begin("b/ce/0")
    assert "b/ce/0" in capsys.readouterr().err  # the bar shows the current run
    t[0] += 5
    out = p.end("b/ce/0", "done in 5 s", seconds=5)
    cap = capsys.readouterr()
    assert written == [] and cap.out == out + "\n"  # the line goes above the bar, on stdout
    assert "1/2 runs" in cap.err and "b/ce/0" in cap.err
    p.end("b/ls/0", "finished earlier; skipped")
    assert "2/2 runs" in capsys.readouterr().err
    p.close()
    assert p._bar is None
    gone = capsys.readouterr().err  # the bar is cleared, not left on the screen
    assert "\n" not in gone and gone.strip() == "" and gone
    p.close()  # twice is harmless
    # no bar for an empty bench, nor by default when stderr is not a terminal; by default on one
    assert RunProgress(0, bar=True)._bar is None
    assert RunProgress(2)._bar is None
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    shown = RunProgress(2)
    assert shown._bar is not None and shown._bar.total == 2
    shown.close()


def test_phases_say_one_line_each_off_a_terminal_and_time_every_phase():
    from calibkit.bench.progress import Phases

    t, lines = [0.0], []
    p = Phases("report", bar=False, write=lines.append, now=lambda: t[0])
    with p.phase("fitting calibrators"):
        t[0] += 3.0
    with p.phase("a table", say=False):  # timed, not announced
        t[0] += 0.25
    with p.phase("fitting calibrators"):  # a phase met twice adds up
        t[0] += 1.0
    assert lines == ["report: fitting calibrators"] * 2
    assert p.times == {"fitting calibrators": 4.0, "a table": 0.25}
    assert set(p.cpu) == set(p.times) and all(v >= 0 for v in p.cpu.values())
    assert p.summary() == "report: 4.2 s (fitting calibrators 4.0 s, a table 0.2 s)"


def test_quiet_phases_write_nothing_and_a_terminal_gets_a_bar_that_is_removed(capsys):
    from calibkit.bench.progress import Phases

    lines = []
    quiet = Phases("report", quiet=True, bar=True, write=lines.append)
    with quiet.phase("x", total=2) as ph:
        ph.tick()
        assert ph._bar is None
    assert lines == [] and capsys.readouterr().err == "" and set(quiet.times) == {"x"}
    shown = Phases("report", bar=True, write=lines.append)
    with shown.phase("drawing", total=2) as ph:
        ph.tick(2)
        assert ph._bar is not None and ph._bar.n == 2
    assert ph._bar is None and lines == [] and "report: drawing" in capsys.readouterr().err
