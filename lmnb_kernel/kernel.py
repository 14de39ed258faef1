"""The ``lmnb`` kernel: IPython plus the lmnb extension, with a fast engine shutdown.

A thin ``IPythonKernel`` subclass (research/jupyter.md §1.1–1.2): it loads the extension at start
(cheap: no model is loaded until the first ``%%lm`` cell), keeps ``language_info.name == "python"``
so papermill, nbconvert and editors treat notebooks as Python, and in ``do_shutdown`` stops the
engine within the restart deadline (jupyter_client sends SIGTERM after ``shutdown_wait_time / 2``,
2.5 s by default).
"""

from __future__ import annotations

import atexit
import inspect
import os
import sys

from ipykernel.ipkernel import IPythonKernel

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


def main() -> None:
    """Launch the kernel (``python -m lmnb_kernel -f CONNECTION_FILE``)."""
    from ipykernel.kernelapp import IPKernelApp

    IPKernelApp.launch_instance(kernel_class=LMNBKernel)
