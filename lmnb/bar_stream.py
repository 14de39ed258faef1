"""The stream a tqdm progress bar draws on (stderr), shared by ``run_batch(progress_bar=True)``
and a job's row bar (``lmnb.batch.runner``)."""

from __future__ import annotations

from typing import Callable, Optional


class BarStream:
    """Wraps the bar's stream so that a write that fails is dropped, not raised, and the bar
    draws no more: the bar only shows the work, which goes on (``2> log`` on a full disk,
    ``OSError`` ENOSPC; past a file size limit, EFBIG; tqdm itself drops EIO alone). tqdm (4.70)
    draws the bar holding its lock and does not release it when the write raises (``refresh``
    and ``clear`` have no try/finally), so the next draw, print above the bar, or a bar's
    ``__del__`` on a pool thread the interpreter joins at exit, waited for that lock forever:
    the program hung; a job stopped at the bar's first draw, before any row ran.

    ``on_closed`` (no arguments) is called once, where the write that failed met a pipe its reader
    closed (``BrokenPipeError``: ``2>&1 | head``), which a job takes for the signal to stop. The
    wrapper compares equal to the stream it wraps, so ``tqdm.write(file=sys.stderr)`` still clears
    the bars drawn on it."""

    def __init__(self, target, on_closed: Optional[Callable[[], None]] = None):
        self.target = target
        self.on_closed = on_closed
        self.broken = False  # a write failed: the bar draws no more

    def write(self, text: str) -> int:
        if not self.broken:
            try:
                self.target.write(text)
            except OSError as e:
                self._failed(e)
        return len(text)

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
