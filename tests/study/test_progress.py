"""The study's progress: plain lines off a terminal, a bar on one, and the ETA arithmetic."""

from __future__ import annotations

import io

import pytest

from rl_transformers.study.progress import Progress, duration, eta_seconds


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_eta_from_the_estimates_corrected_by_measured_durations() -> None:
    # nothing finished yet: the estimates as they are; running jobs count what is left of theirs
    assert eta_seconds([100.0, 300.0], [(50.0, 20.0)], [], workers=2) == pytest.approx((400 + 30) / 2)
    # a running job past its estimate counts 0, not a negative time
    assert eta_seconds([100.0], [(50.0, 80.0)], [], workers=1) == pytest.approx(100.0)
    # finished jobs took twice their estimates (a busier machine): the rest is scaled by 2
    assert eta_seconds([100.0], [], [(10.0, 25.0), (40.0, 75.0)], workers=1) == pytest.approx(200.0)
    assert eta_seconds([], [], [(10.0, 5.0)], workers=4) == 0.0
    assert eta_seconds([60.0], [], [], workers=0) == 60.0  # at least one worker


def test_durations_read_as_hours_minutes_seconds() -> None:
    assert [duration(s) for s in (0, 12.4, 250, 3900, 50_000)] == ["0s", "12s", "4m 10s", "1h 05m", "13h 53m"]


def test_off_a_terminal_each_outcome_is_one_plain_line_with_the_counts() -> None:
    clock, said, stream = Clock(), [], io.StringIO()  # a StringIO is no terminal: no bar
    progress = Progress({"a": 100.0, "b": 100.0, "c": 210.0}, workers=2, log=said.append, stream=stream,
                        clock=clock)  # fmt: skip
    assert progress.counts() == (0, 0, 3) and progress.status().endswith("ETA 3m 25s")  # 410 s / 2 workers
    progress.start("a")
    progress.start("b")
    clock.now = 50.0
    progress.finish("a", "  done a")  # took 50 s of an estimated 100: the rest is scaled by 0.5
    assert said == ["  done a  [1/3 done, 1 running, 1 left, ETA 1m 05s]"]  # 0.5 * (210 + 50) / 2 = 65
    progress.start("c")
    clock.now = 150.0
    progress.finish("b", "  FAILED b")
    progress.finish("c", "  done c")
    assert said[-1].startswith("  done c  [3/3 done, 0 running, 0 left, ETA 0s]")
    progress.close()
    assert stream.getvalue() == ""  # nothing but the log lines


def test_on_a_terminal_a_bar_shows_the_counts_and_the_outcome_lines() -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream, said, clock = Terminal(), [], Clock()
    progress = Progress({"a": 10.0, "b": 10.0}, workers=1, log=said.append, stream=stream, clock=clock)
    progress.start("a")
    clock.now = 10.0
    progress.finish("a", "  done a")
    progress.close()
    text = stream.getvalue()
    assert said == [] and "  done a" in text and "1/2" in text and "0 running, 1 left, ETA 10s" in text
