"""The ``lmnb`` kernel: IPython plus the lmnb extension, with a fast engine shutdown.

A thin ``IPythonKernel`` subclass (research/jupyter.md §1.1–1.2): it loads the extension at start
(cheap: no model is loaded until the first ``%%lm`` cell), keeps ``language_info.name == "python"``
so papermill, nbconvert and editors treat notebooks as Python, and in ``do_shutdown`` stops the
engine within the restart deadline (jupyter_client sends SIGTERM after ``shutdown_wait_time / 2``,
2.5 s by default). ``LMNBKernelApp`` is ipykernel's application with one option more, for
``lmnb run``'s kernel: an IOPub socket that waits for its client instead of dropping output.
"""

from __future__ import annotations

import atexit
import inspect
import os
import sys

import zmq
from ipykernel.ipkernel import IPythonKernel
from ipykernel.kernelapp import IPKernelApp
from traitlets import Bool

from lmnb_kernel import __version__
from lmnb_kernel.surrogates import make_session_surrogate_safe

SHUTDOWN_TIMEOUT_S = 2.0


class LMNBKernel(IPythonKernel):
    """IPython kernel with ``%%lm`` cells; kernelspec name ``lmnb``."""

    implementation = "lmnb"
    implementation_version = __version__
    banner = f"lmnb {__version__}: IPython with %%lm cells (LM programs on an in-process engine)"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        make_session_surrogate_safe(self.session)  # (the session of stdout/stderr too; for good, past an unload)
        self.shell.extension_manager.load_extension("lmnb_kernel")

    def do_complete(self, code, cursor_pos):
        """IPython's completion, but in a ``%lm`` line or a ``%%lm`` cell the magics' own names
        (``lmnb_kernel.complete``)."""
        from lmnb_kernel.complete import lm_completions

        cursor_pos = len(code) if cursor_pos is None else cursor_pos
        ours = lm_completions(code, cursor_pos, lambda c, p: super(LMNBKernel, self).do_complete(c, p))
        return ours if ours is not None else super().do_complete(code, cursor_pos)

    def do_is_complete(self, code):
        """IPython's answer, but a ``%%lm`` cell with a hole or block still open is incomplete and
        one the cell parser refuses is invalid (``lmnb_kernel.complete``)."""
        from lmnb_kernel.complete import lm_is_complete

        return lm_is_complete(code) or super().do_is_complete(code)

    async def do_shutdown(self, restart):
        """Close the session (engine and server connections) before the kernel exits."""
        from lmnb_kernel.session import get_session

        get_session().close(timeout=SHUTDOWN_TIMEOUT_S)
        reply = super().do_shutdown(restart)
        reply = (await reply) if inspect.isawaitable(reply) else reply
        # Registered last, so it runs first when the interpreter exits.
        atexit.register(_exit_now, self.shell)
        return reply


def _exit_now(shell) -> None:
    """End the process once IPython has saved its state, skipping the interpreter's teardown.

    With torch loaded, tearing down the interpreter takes seconds on a busy machine — longer than
    the 2.5 s jupyter_client waits before it sends SIGTERM on restart. The engine is already shut
    down here; IPython's own exit work (history) is done explicitly first.
    """
    shell.atexit_operations()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(0)


class LMNBKernelApp(IPKernelApp):
    """ipykernel's kernel application, with the option of an IOPub socket that waits instead of
    dropping (``lmnb run``'s kernel)."""

    iopub_nodrop = Bool(False, help="""Make the IOPub socket wait for a subscriber that is behind
        instead of dropping its messages (ZeroMQ's XPUB_NODROP). ZeroMQ's default, which ipykernel
        keeps, drops what is sent to a subscriber with 1000 messages queued (its send high-water
        mark): a flood of output (a loop of flushed prints) loses some. Waiting keeps every message,
        but a subscriber that stops reading holds up the kernel's output to all: for a kernel with
        one client that reads all it sends, as lmnb run's.""").tag(config=True)

    def init_iopub(self, context):
        """ipykernel's IOPub socket and thread, the socket set not to drop with ``iopub_nodrop``."""
        super().init_iopub(context)
        if self.iopub_nodrop:
            thread = self.iopub_thread
            # Set on the IOPub thread, which owns the socket (a ZeroMQ socket is not thread-safe),
            # ahead of every message sent after this (its events run in order).
            thread.schedule(lambda: thread.socket.setsockopt(zmq.XPUB_NODROP, 1))


def main() -> None:
    """Launch the kernel (``python -m lmnb_kernel -f CONNECTION_FILE``; add
    ``--LMNBKernelApp.iopub_nodrop=True`` for an IOPub socket that does not drop)."""
    LMNBKernelApp.launch_instance(kernel_class=LMNBKernel)
