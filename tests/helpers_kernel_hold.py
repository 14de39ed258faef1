"""Holding the streams of a kernel's in-process engine, so that a test can see a cell's view while
its generation is held half-way: what the frontend got by then was sent while the cell ran.

Without the hold, "updates came before the cell ended" held for a view that sent every update at
the end (the messages still come before the idle status, in order), so such a test could fail
only on a machine fast enough to end the generation before the view's first frame.
"""

from __future__ import annotations

from pathlib import Path

# The kernel's cells run on ``lmnb.Engine``; each stream of it yields ``after`` deltas, then waits
# for the file ``gate``. A gate not opened in 120 s fails the gen (the cell's error says so), so a
# kernel whose view never streams ends the cell with that error instead of hanging for good.
_HOLD = r"""
import os as _os, time as _time
import lmnb.backend.engine as _engine_module

def _held_stream(self, *args, _original=_engine_module.Engine.generate_stream, **kwargs):
    for _i, _item in enumerate(_original(self, *args, **kwargs)):
        if _i == {after}:
            _deadline = _time.monotonic() + 120
            while not _os.path.exists({gate!r}):
                if _time.monotonic() > _deadline:
                    raise RuntimeError("the test held the engine for 120 s and never opened its gate")
                _time.sleep(0.01)
        yield _item

_held_stream.original = _engine_module.Engine.generate_stream
_engine_module.Engine.generate_stream = _held_stream
"""

RELEASE_CELL = r"""
import lmnb.backend.engine as _engine_module
_engine_module.Engine.generate_stream = _engine_module.Engine.generate_stream.original
"""


def hold_cell(gate: Path, after: int) -> str:
    """Code for a cell of an lmnb kernel: from then on each stream of its engine stops after
    ``after`` deltas until the file ``gate`` exists; ``RELEASE_CELL`` puts the engine back."""
    return _HOLD.format(gate=str(gate), after=after)
