"""The kernel client of ``lmnb run``: it executes the notebook's cells in the kernel and reads
what the kernel sends on IOPub into the cells' outputs (``Client``, an nbclient ``NotebookClient``).

``lmnb_kernel.run`` is the command around it: its arguments, reading and saving the notebook,
parameters, signals and the report.
"""

from __future__ import annotations

import asyncio
import re
import signal
from queue import Empty

from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionComplete
from nbclient.util import ensure_async
from traitlets import Integer


class Client(NotebookClient):
    """nbclient's ``NotebookClient`` (``Client(nb, **kwargs)``, ``kwargs`` as it takes them) that
    saves no state of a widget the kernel has closed. nbclient keeps every widget's last state in
    the notebook's metadata, closed ones too: about 6 KB per ``%%lm`` cell under ``LMNB_VIEW=live``
    (the live view's JavaScript and layout), whose output the static view has replaced. A closed
    widget shows nowhere (a frontend drops its model, and JupyterLab saves no state of it). Its
    ``iopub_timeout`` (seconds) may be None: no limit on the wait for a cell's output after its
    reply. One reader reads the kernel's messages for the whole run (``_read_output``): output a
    cell sends once its wait has ended (a thread's print, a late display or widget update), read
    while a later cell runs or as the run ends (``read_last_output``), goes to that cell under its
    own pending ``clear_output(wait=True)``, as a frontend shows it, where nbclient drops it."""

    # How long to wait, after a cell's execute reply, for the rest of its output, up to the
    # kernel's idle status that ends it; None: no limit. nbclient's wait (4 s by default, an
    # int only) goes on to the next cell past it, whose reader then drops the late messages
    # (they answer the earlier cell's request): a %%lm view's last update and summary come at
    # the cell's very end, and a loaded machine delivered them later than 4 s, or than a fixed
    # 60 s. lmnb run gives it the cell's own --timeout: a live kernel always says idle after
    # the reply (ipykernel publishes it once the request's handler has returned, whatever the
    # handler raised; SIGINT is ignored outside the handler, and a Ctrl-C that lands as the
    # handler returns, the one way to lose it, ends this wait itself: stop_output_wait), and the
    # run's kernel drops none of its IOPub messages (kernel.LMNBKernelApp.iopub_nodrop, which
    # run.kernel_manager, the only way lmnb run starts a kernel, always sets; ZeroMQ honours it on
    # ipykernel 6's PUB socket as on 7's XPUB), so the wait ends as the output does, and a kernel
    # that dies meanwhile is found by nbclient's check, which runs through the wait.
    iopub_timeout = Integer(4, allow_none=True).tag(config=True)
    QUIET_S = 0.5  # the reader's poll; once the kernel has exited, this long with no message ends it

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._cell_of_request: dict[str, int] = {}  # execute request id -> its cell's index
        self._clear_pending: dict[int, bool] = {}  # a cell's index -> its clear_output(wait=True) to come
        self._idle: dict[int, asyncio.Future] = {}  # a cell's index -> done at its idle status
        self._reader: asyncio.Future | None = None  # the one reader of the kernel's iopub messages
        self._last_read = False  # read_last_output: stop at the first quiet QUIET_S
        self._awaited_output: asyncio.Future | None = None  # the reader of a cell whose reply has come
        self._stopped_output: asyncio.Future | None = None  # the one stop_output_wait ended
        # the cell whose execute reply came last: its code has ended in the kernel (lmnb run's
        # Ctrl-C then interrupts no cell)
        self.replied = None

    def stop_output_wait(self) -> bool:
        """End the wait for the running cell's output after its reply (a Ctrl-C then: the
        cell has ended, and its idle status, which ends the wait, may be far behind, after a
        flood of output the run has yet to read). Only the wait ends: the run's one reader
        (``_read_output``) goes on, and what the cell sends later still lands in it, up to the
        kernel's exit (``read_last_output``). Whether such a wait was under way."""
        reader = self._awaited_output
        if reader is None or reader.done():
            return False
        self._stopped_output = reader
        reader.cancel()
        return True

    async def _async_poll_for_reply(self, msg_id, cell, timeout, task_poll_output_msg, task_poll_kernel_alive):
        """nbclient's wait for a cell's reply, then for its output (its reader, up to
        ``iopub_timeout``), which ``stop_output_wait`` ends. (A private method of nbclient, as
        the reader below.)"""
        # a coroutine, not a task: nbclient's wait starts it once the reply has come
        output = self._output_after_reply(task_poll_output_msg, cell)
        try:
            return await super()._async_poll_for_reply(msg_id, cell, timeout, output, task_poll_kernel_alive)
        finally:
            output.close()  # (never started where no reply came: no "never awaited" warning)

    async def _output_after_reply(self, reader: asyncio.Future, cell) -> None:
        """Wait for the end of ``cell``'s output, its reply in (``replied``): the kernel's idle
        status for it (``reader``, the wait of ``_async_poll_output_msg``), or ``stop_output_wait``."""
        self.replied = cell
        self._awaited_output = reader
        try:
            await asyncio.wait([reader])
        finally:  # (cancelled: the wait's limit, as nbclient's wait on its reader, ends it at once)
            self._awaited_output = None
            reader.cancel()  # (a wait, not a read: nothing is lost)
        if reader.cancelled() and self._stopped_output is not reader:
            raise asyncio.CancelledError
        if not reader.cancelled():
            reader.result()  # (the reader's error, as nbclient's reader raised it)

    async def _async_poll_output_msg(self, parent_msg_id, cell, cell_index) -> None:
        """nbclient's reader of a cell's output, which ends with the kernel's idle status:
        here a wait for that status, read by the run's one reader of the kernel's messages
        (``_read_output``). Cancelled (``iopub_timeout``, a Ctrl-C), it is the wait that ends,
        never a read: nbclient's reader, cancelled as a message came in, lost that message.
        (A private method of nbclient; were it renamed, its own would run, which drops the
        output of a cell that comes once the cell's reader has ended.)"""
        self._cell_of_request[parent_msg_id] = cell_index
        self._clear_pending[cell_index] = self.clear_before_next_output  # (False: nbclient's, for a new cell)
        idle = self._idle[cell_index] = asyncio.get_running_loop().create_future()
        if self._reader is None or self._reader.done():
            self._reader = asyncio.ensure_future(self._read_output())
        await asyncio.shield(idle)

    async def _read_output(self) -> None:
        """Read the kernel's iopub messages until ``read_last_output`` ends it, giving each
        to the cell whose request it answers (``_process``), also once that cell has ended, as
        a frontend shows it: sent while no cell ran (the kernel's parent is then the last
        cell's: a thread's output, a display or widget update), past the wait for a cell's
        output, or while the run ends. A message of no cell is dropped, as nbclient drops it."""
        try:
            while True:
                try:
                    msg = await ensure_async(self.kc.iopub_channel.get_msg(timeout=self.QUIET_S))
                except Empty:
                    if self._last_read:
                        return
                    continue
                index = self._cell_of_request.get(msg["parent_header"].get("msg_id"))
                if index is None or not _kept_after_stripping_shutdown_log(msg):
                    continue
                try:
                    self._process(msg, index)
                except CellExecutionComplete:
                    if not self._idle[index].done():
                        self._idle[index].set_result(None)
        except Exception as e:  # (as nbclient's reader raised into the cell's wait)
            for idle in self._idle.values():
                if not idle.done():
                    idle.set_exception(e)
            raise

    async def read_last_output(self) -> None:
        """Once the kernel has exited: read what it sent before, until ``QUIET_S`` pass with
        no message, and stop reading (``_read_output``). Output a cell sent after the last
        cell ended (a thread's print), or still on its way as the run stopped, then lands in
        its cell, where the run's end lost it. A Ctrl-C or SIGTERM (main thread) ends the read
        there, keeping what it read: a kernel that outlived its shutdown and kept printing
        held it for ever."""
        self._last_read = True
        if self._reader is None:
            return
        loop = asyncio.get_running_loop()
        handled = []
        for number in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(number, self._reader.cancel)
                handled.append(number)
            except (NotImplementedError, RuntimeError, ValueError):  # (Windows; not the main thread)
                pass
        try:
            await self._reader
        except (Exception, asyncio.CancelledError):  # (the reader's error was the cell's, raised there)
            pass
        finally:
            for number in handled:
                loop.remove_signal_handler(number)

    def _process(self, msg, index: int) -> None:
        """``process_message`` of a message of the cell ``index``, under that cell's own
        pending ``clear_output(wait=True)``: nbclient keeps one flag, the running cell's, and
        a late clear of an earlier cell's would have emptied the running cell's output."""
        running = self.clear_before_next_output
        self.clear_before_next_output = self._clear_pending.get(index, False)
        try:
            self.process_message(msg, self.nb.cells[index], index)
        finally:
            self._clear_pending[index] = self.clear_before_next_output
            self.clear_before_next_output = running

    def output(self, outs, msg, display_id, cell_index):
        """nbclient's ``output``, which adds each stream message as an output of its own: one
        that follows a stream output of the same name (stdout, stderr) is added to its text,
        as JupyterLab's output area and Jupyter's saved notebooks merge them, so prints that
        came in apart (a thread's late ones, a slow loop's) read as one block."""
        out = super().output(outs, msg, display_id, cell_index)
        if (out is not None and display_id is None and out.output_type == "stream" and len(outs) > 1 and outs[-1] is out
                and outs[-2].get("output_type") == "stream" and outs[-2].get("name") == out.name):
            outs.pop()
            # the text is taken out first, so that the str is referenced only here: CPython then
            # grows it in place, where `+=` on the attribute copied it whole for every message
            # (quadratic: 100k flushed prints took minutes)
            text, outs[-1].text = outs[-1].text, ""
            text += out.text
            outs[-1].text = text
            return outs[-1]
        return out

    def handle_comm_msg(self, outs, msg, cell_index) -> None:
        super().handle_comm_msg(outs, msg, cell_index)
        if msg["msg_type"] == "comm_close":
            self.widget_state.pop(msg["content"].get("comm_id"), None)
            self.widget_buffers.pop(msg["content"].get("comm_id"), None)


# What asyncio logs to stderr as ipykernel shuts down with one of its own tasks still pending
# (its control dispatch, which handles the shutdown request itself): the kernel may forward it
# before it exits, and the run reads the kernel's output until then, so it landed in the last cell.
_KERNEL_SHUTDOWN_NOISE = re.compile(
    r"Task was destroyed but it is pending!\ntask: <Task pending name='[^'\n]*' coro=<Kernel\.\w+\(\) running at "
    r"[^\n]*ipykernel[^\n]*>\n?")


def _kept_after_stripping_shutdown_log(msg: dict) -> bool:
    """Take ipykernel's own shutdown log (``_KERNEL_SHUTDOWN_NOISE``) out of a stderr stream
    message ``msg`` (in place), and say whether the message is kept: False where nothing else is
    left, so it is dropped; True for every other message. A task of the user's code that asyncio
    logs so is kept: only a pending ``Kernel`` method of ipykernel is taken out."""
    content = msg.get("content", {})
    if msg.get("msg_type") != "stream" or content.get("name") != "stderr":
        return True
    text = _KERNEL_SHUTDOWN_NOISE.sub("", content.get("text", ""))
    content["text"] = text
    return bool(text)
