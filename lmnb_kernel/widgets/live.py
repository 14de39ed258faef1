"""The anywidget model behind a running view: full-state trait plus incremental op messages.

State lives in two synced traits — ``snapshot`` (``{"seq": int, "html": str}``, the whole view) and
``status`` — so a page that renders the widget late (or reloads) shows a complete picture. Between
snapshots the Python side sends custom messages ``{"type": "ops", "seq", "ops"}`` that set or append
HTML at keyed elements (see ``live.js``), so a growing lane costs the bytes of its new tokens, not of
the whole lane. A frame is sent as exactly one comm message.
"""

from __future__ import annotations

import logging
import pathlib
from collections import deque
from typing import Callable, Optional

import anywidget
import traitlets


class _ClosedViewComms(logging.Filter):
    """Drops the ``comm`` package's "No such comm: ID" warning for the comm of a view that closed:
    a Stop click sent before the frontend saw the close reaches the kernel after the cell ended,
    where there is nothing to stop, and the warning showed in the notebook as the cell's stderr
    (twice on a subshell, whose routing looks the comm up too). Other ids still warn."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: deque[str] = deque(maxlen=256)  # the last views' comms: a click comes soon after

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.msg == "No such comm: %s" and record.args and record.args[0] in self.ids)


_CLOSED = _ClosedViewComms()
logging.getLogger("Comm").addFilter(_CLOSED)  # (comm.base_comm's logger)


class LiveRunWidget(anywidget.AnyWidget):
    """One run's live view. Mutate it only from the thread that created it (the cell's main thread);
    ``on_stop`` is called from whichever thread the kernel delivers the Stop click on."""

    _esm = pathlib.Path(__file__).with_name("live.js")
    snapshot = traitlets.Dict({"seq": -1, "html": ""}).tag(sync=True)
    status = traitlets.Unicode("running").tag(sync=True)

    def __init__(self, html: str, on_stop: Optional[Callable[[], None]] = None) -> None:
        super().__init__(snapshot={"seq": 0, "html": html})
        self._seq = 0
        self._on_stop = on_stop
        self.on_msg(self._on_custom_msg)
        self._handle_clicks_where_they_arrive()

    @property
    def seq(self) -> int:
        """Sequence number of the last frame sent (snapshot or ops)."""
        return self._seq

    def send_ops(self, ops: list[dict]) -> None:
        """Send one frame of ops (``{"op": "set"|"append", "k": key, "html": str}``)."""
        self._seq += 1
        self.send({"type": "ops", "seq": self._seq, "ops": ops})

    def send_snapshot(self, html: str, status: Optional[str] = None) -> None:
        """Replace the whole view (and the status, in the same comm message)."""
        self._seq += 1
        with self.hold_sync():
            self.snapshot = {"seq": self._seq, "html": html}
            if status is not None:
                self.status = status

    def close(self) -> None:
        """Close the comm; a Stop click on it that arrives later is ignored without a warning."""
        if self.comm is not None:
            _CLOSED.ids.append(self.comm.comm_id)
        super().close()

    def _handle_clicks_where_they_arrive(self) -> None:
        # ipykernel >= 7.4 runs a frontend comm message on the subshell that last *published* on
        # that comm (ipykernel/comm/comm.py ``_reply_subshell_for``, for request/reply widgets). This
        # view publishes from the busy main shell, so a Stop click that JupyterLab sends on its comm
        # subshell would wait behind the cell. The view asks nothing of the frontend, so let each
        # message run on the subshell it was sent on. Kernels without the hook are unaffected.
        comm = self.comm
        if comm is not None and hasattr(comm, "_reply_subshell_for"):
            comm._reply_subshell_for = lambda _data, sent_on: sent_on

    def _on_custom_msg(self, _widget, content, _buffers) -> None:
        if isinstance(content, dict) and content.get("action") == "stop" and self._on_stop is not None:
            self._on_stop()
