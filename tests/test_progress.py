"""Progress off a terminal: plain lines now and then, not a stream of carriage-return updates."""

from __future__ import annotations

import io

from weightformer.progress import progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_off_a_terminal_a_long_loop_writes_a_few_plain_lines_and_a_short_one_none():
    log = io.StringIO()
    assert list(progress(range(250), desc="ddpm 250 steps", unit="step", stream=log, interval=0.0)) == list(range(250))
    lines = log.getvalue().splitlines()
    assert len(lines) == 250 and lines[-1].startswith("ddpm 250 steps: 250/250 step") and "\r" not in log.getvalue()
    quiet = io.StringIO()
    list(progress(range(250), desc="short", stream=quiet))  # well under PLAIN_LINE_SECONDS
    assert quiet.getvalue() == ""


def test_on_a_terminal_it_is_a_tqdm_bar_and_disabled_it_is_silent():
    terminal = Terminal()
    list(progress(range(3), desc="bar", stream=terminal))
    assert "\r" in terminal.getvalue() and "bar" in terminal.getvalue()
    silent = io.StringIO()
    list(progress(range(3), desc="off", stream=silent, enabled=False, interval=0.0))
    assert silent.getvalue() == ""
