"""The stream a tqdm progress bar draws on (stderr), shared by ``run_batch(progress_bar=True)``
and a job's row bar (``lmnb.batch.runner``)."""

from __future__ import annotations

from typing import Callable, Optional


class BarStream:
    """Wraps the bar's stream so that a write into a pipe its reader closed (``2>&1 | head``) is
    dropped, not raised, and the bar draws no more. tqdm (4.70) draws the bar holding its lock and
    does not release it when the write raises (``refresh`` and ``clear`` have no try/finally), so
    the next draw, print above the bar, or a bar's ``__del__`` on a pool thread the interpreter
    joins at exit, waited for that lock forever: the program hung.

    ``on_closed`` (no arguments) is called once, at the first write or flush that meets the closed
    pipe. ``drops``: the errors dropped so, ``BrokenPipeError`` by default; ``OSError`` for a bar
    whose stream may fail otherwise too and whose program has nothing else to say there
    (``run_batch``: a ``2> log`` on a full disk, ``OSError`` ENOSPC, hung it the same way). The
    wrapper compares equal to the stream it wraps, so ``tqdm.write(file=sys.stderr)`` still clears
    the bars drawn on it."""

    def __init__(self, target, on_closed: Optional[Callable[[], None]] = None,
                 drops: type[OSError] = BrokenPipeError):
        self.target = target
        self.on_closed = on_closed
        self.drops = drops
        self.broken = False  # a write met the closed pipe: the bar draws no more

    def write(self, text: str) -> int:
        if not self.broken:
            try:
                self.target.write(text)
            except self.drops:
                self._closed()
        return len(text)

    def flush(self) -> None:
        if not self.broken:
            try:
                self.target.flush()
            except self.drops:
                self._closed()

    def _closed(self) -> None:
        self.broken = True
        if self.on_closed is not None:
            self.on_closed()

    def __eq__(self, other) -> bool:
        return other is self or other == self.target

    def __hash__(self) -> int:
        return hash(self.target)

    def __getattr__(self, name: str):  # fileno, encoding, isatty, ... of the real stream
        return getattr(self.target, name)
