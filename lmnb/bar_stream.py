"""The progress bar of ``run_batch(progress_bar=True)`` and of a job's rows (``lmnb.batch.runner``):
a tqdm bar on stderr, drawn in place on a terminal and written as lines elsewhere, which never
stops the work it counts (``BarStream``)."""

from __future__ import annotations

import os
import sys
from typing import Any, Callable, Optional

# Seconds between two of a bar's lines where stderr is no terminal (`2> job.log`, nohup, CI): a
# log shows the work going on without a line per item. tqdm's own $TQDM_MININTERVAL sets another.
LOG_INTERVAL = 30.0


def is_live(stream: Any) -> bool:
    """Whether a bar on ``stream`` is drawn in place, by ``\\r`` frames: a terminal, or a Jupyter
    kernel's stream, which the notebook shows in place (its ``isatty()`` says False). Elsewhere (a
    pipe, a file) every frame stayed in the log, one carriage return after the other."""
    kernel = sys.modules.get("ipykernel.iostream")  # (imported where a kernel runs)
    if kernel is not None and isinstance(stream, kernel.OutStream):
        return True
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):  # (a stream without isatty; a closed one)
        return False


def progress_bar(total: int, live: bool, on_closed: Optional[Callable[[], None]] = None, **options: Any):
    """A tqdm bar counting ``total`` items on ``sys.stderr`` (through ``BarStream``, which calls
    ``on_closed`` where stderr is a closed pipe). ``live`` (``is_live(sys.stderr)``): drawn in
    place, as tqdm draws it; else written in whole lines (ASCII): at the start, at most every
    ``LOG_INTERVAL`` seconds as items are done, and the last, with the count done, at ``close()``.
    ``options``: tqdm's (``desc``, ``unit``, ``disable``, ...). Where there is no stderr
    (``sys.stderr`` None: ``2>&-``), the bar is disabled: nothing to draw on, the work goes on."""
    from tqdm import tqdm

    if sys.stderr is None:  # (stderr closed, `2>&-`, or none, pythonw: Python's is None, whose write raised AttributeError)
        return tqdm(total=total, **{**options, "disable": True})
    if live:
        # (the size read here, not by tqdm, which takes a terminal's unknown size for a negative one)
        dynamic = options.pop("dynamic_ncols", False)
        ncols, nrows = screen_shape(sys.stderr)
        bar = tqdm(total=total, file=BarStream(sys.stderr, on_closed),
                   **{"ncols": ncols, "nrows": nrows, **options})
        if dynamic:  # (tqdm reads the size at each frame through this attribute, its own reader where set)
            bar.dynamic_ncols = screen_shape
        return bar
    # (miniters=1: no line between items, which tqdm's monitor thread draws where it sets miniters)
    log: dict = {"miniters": 1, "ascii": True}
    # (tqdm's own setting wins; read here, as tqdm reads it only as it is imported, before a
    # notebook's %env or a set-up cell could set it)
    log["mininterval"] = float(os.environ.get("TQDM_MININTERVAL", LOG_INTERVAL))
    return tqdm(total=total, file=BarStream(sys.stderr, on_closed, lines=True), **log, **options)


def screen_shape(stream: Any) -> tuple[Optional[int], Optional[int]]:
    """The width and height (ncols, nrows) of a bar drawn in place on ``stream``, as tqdm reads
    them, its terminal's columns and lines less one, but for a size of 0, which a terminal gives
    where it does not know it (``stty rows 0``, a pty no one sized): that is ``$COLUMNS`` or
    ``$LINES`` where set, else 80 columns or 24 lines, as ``shutil.get_terminal_size`` and rich
    take it. tqdm took 0 lines for -1 and drew no bar at all, and 0 columns cut the bar's end. A
    stream drawn in place that is no terminal, a Jupyter kernel's, takes that size too: its
    ``fileno()`` is the terminal the server was started from (tqdm's reader took that width, 200
    columns, say, for the notebook's). (None, None) where ``stream`` has no size to read (no
    fileno, closed): tqdm's defaults."""
    try:
        columns, lines = os.get_terminal_size(stream.fileno()) if stream.isatty() else (0, 0)
    except (AttributeError, ValueError, OSError):  # (no fileno or isatty, a closed stream, no terminal)
        return None, None
    return (columns or _environment_size("COLUMNS", 80)) - 1, (lines or _environment_size("LINES", 24)) - 1


def _environment_size(name: str, default: int) -> int:
    """The positive number ``$name`` holds, else ``default``."""
    value = os.environ.get(name, "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else default


class BarStream:
    """Wraps the bar's stream so that a write that fails is dropped, not raised, and the bar
    draws no more: the bar only shows the work, which goes on (``2> log`` on a full disk,
    ``OSError`` ENOSPC; past a file size limit, EFBIG; tqdm itself drops EIO alone). tqdm (4.70)
    draws the bar holding its lock and does not release it when the write raises (``refresh``
    and ``clear`` have no try/finally), so the next draw, print above the bar, or a bar's
    ``__del__`` on a pool thread the interpreter joins at exit, waited for that lock forever:
    the program hung; a job stopped at the bar's first draw, before any row ran.

    ``on_closed`` (no arguments) is called once, where the write that failed met a pipe its reader
    closed (``BrokenPipeError``: ``2>&1 | head``), which a job takes for the signal to stop.
    ``lines``: each of tqdm's frames (``\\r``, the bar, spaces over the rest of the last) is written
    as a line of its own, and its clearing of the bar (spaces) and its last line break are left
    out: for a stream that does not draw in place (a log file). A line that says what the last one
    said, but for its times (``_without_times``), is left out too: ``close()`` draws the bar once
    more, so a log where the last item's update drew it (``TQDM_MININTERVAL=0``) had the last line
    twice. The wrapper compares equal to the stream it wraps, so ``tqdm.write(file=sys.stderr)``
    still clears the bars drawn on it."""

    def __init__(self, target, on_closed: Optional[Callable[[], None]] = None, lines: bool = False):
        self.target = target
        self.on_closed = on_closed
        self.lines = lines
        self.broken = False  # a write failed: the bar draws no more
        self.last = None  # (lines) the last line written, without its times

    def write(self, text: str) -> int:
        size = len(text)
        if self.lines:
            text = text.rpartition("\r")[2].rstrip()
            if _without_times(text) == self.last:
                text = ""
            elif text:
                self.last = _without_times(text)
                text += "\n"
        if text and not self.broken:
            try:
                self.target.write(text)
            except OSError as e:
                self._failed(e)
        return size

    def flush(self) -> None:
        if not self.broken:
            try:
                self.target.flush()
            except OSError as e:
                self._failed(e)

    def _failed(self, error: OSError) -> None:
        self.broken = True
        if isinstance(error, BrokenPipeError) and self.on_closed is not None:
            self.on_closed()

    def __eq__(self, other) -> bool:
        return other is self or other == self.target

    def __hash__(self) -> int:
        return hash(self.target)

    def __getattr__(self, name: str):  # fileno, encoding, isatty, ... of the real stream
        return getattr(self.target, name)


def _without_times(line: str) -> str:
    """A bar's ``line`` without the elapsed, remaining and rate that open its last ``[...]``
    (tqdm's ``[00:01<00:02, 1.50row/s, errors=1]`` → ``[errors=1]``): what it counts, and its
    postfix, are kept."""
    head, bracket, stats = line.rpartition(" [")
    return head + bracket + ", ".join(stats.split(", ")[2:]) if bracket else line
