"""The kernel's one LM session: the backend, the named program states and their pins.

Process-wide and outside the user namespace, so ``%reset`` and ``%reload_ext`` keep it; a kernel
restart (a new process) is what frees it. The in-process engine is created lazily — on the first
``%%lm`` cell (or ``%lm load``), on the cell's main thread, never at kernel start, so the kernel
answers ``kernel_info`` at once (research/jupyter.md §1.4).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from dataclasses import dataclass, field, fields
from typing import Any, Optional

from lmnb.interrupt import held_interrupts
from lmnb_engine import MODEL_ENV, model_or_env
from lmnb_engine.cli_options import UNPIN, in_option_syntax
from lmnb_engine.waits import future_result, thread_join
from lmnb_kernel.errors import CellError, cell_interrupt


@contextlib.contextmanager
def interrupt_after():
    """Hold SIGINT (ipykernel's interrupt) until the block ends, then raise ``KeyboardInterrupt``.

    Starting an engine imports about a thousand modules (torch, transformers, accelerate); one
    cut short by an interrupt stays half-initialised, and every later load fails until the kernel
    restarts (torch cannot register its operators twice). Off the main thread, a no-op.
    """
    def say_when() -> None:
        sys.stderr.write("lmnb: the model is loading; the interrupt takes effect once it is loaded\n")

    with held_interrupts(on_first=say_when) as held:
        yield
    if held:
        raise cell_interrupt("stopped once the model had loaded; it stays loaded for the next cell")


@dataclass(frozen=True)
class EngineConfig:
    """How to build the in-process engine (``lmnb_engine.Engine`` arguments).

    ``model``: HF checkpoint directory or hub id; None = $LMNB_MODEL, else the built-in demo model.
    ``max_total_tokens``: KV pool size in tokens. ``random_weights``: seeded random weights for
    benchmarks (``model`` may then be a shape preset name).
    """

    model: Optional[str] = None
    device: Optional[str] = None
    dtype: Optional[str] = None
    max_total_tokens: Optional[int] = None
    random_weights: bool = False

    def engine_kwargs(self) -> dict:
        """The ``lmnb_engine.Engine`` arguments this configuration sets."""
        kw = {k: getattr(self, k) for k in ("device", "dtype", "max_total_tokens") if getattr(self, k) is not None}
        if self.random_weights:
            kw["random_weights"] = True
        return kw

    def model_name(self) -> Optional[str]:
        """The model to load: the given one, else ``$LMNB_MODEL``; None means the demo model."""
        return model_or_env(self.model)

    def load_line(self) -> str:
        """The ``%lm load`` line that builds this configuration again, e.g. ``%lm load /models/x
        --dtype bfloat16`` (plain ``%lm load`` for the default one, which reads ``$LMNB_MODEL`` again)."""
        import shlex

        words = ["%lm load"] + ([shlex.quote(self.model)] if self.model else [])
        for name in ("device", "dtype", "max_total_tokens"):
            if getattr(self, name) is not None:
                words.append(f"--{name.replace('_', '-')} {shlex.quote(str(getattr(self, name)))}")
        return " ".join(words + (["--random-weights"] if self.random_weights else []))

    def describe(self) -> str:
        """The model in words, for messages (one taken from ``$LMNB_MODEL`` says so: a broken
        variable made the first cell, and every ``%lm load``, fail on a path the notebook never named);
        with ``random_weights`` it says so, as the model's own weights are not the ones loaded."""
        if not self.model and os.environ.get(MODEL_ENV):
            name = f"{os.environ[MODEL_ENV]} (from ${MODEL_ENV})"
        else:
            name = self.model_name() or "the built-in demo model"
        return f"{name}, with random weights (--random-weights)" if self.random_weights else name


# %lm load's options, which the engine's errors name (in_option_syntax): EngineConfig's fields, but for
# the model, a positional argument there (a failed load's hint says "%lm load PATH_OR_HF_ID").
_LOAD_OPTIONS = frozenset(f.name for f in fields(EngineConfig)) - {"model"}


@dataclass
class NamedState:
    """A program state kept under a name by ``%%lm --state NAME``.

    ``cells``: execution counts of the cells that extended it; ``pin``: the engine's pin handle
    while ``%lm pin NAME`` holds its prefix in the cache. So that re-running the cell that extended
    it last replaces that cell's turn: ``cell_ids``, the Jupyter cell ids of the cells that extended
    it (a client that sends none adds none); ``last_cell_id``, the last of them to extend it (None:
    that cell had no id); ``before``, the ``ProgramState`` as it was before that last extension
    (None: that cell created it).
    """

    name: str
    state: Any  # lmnb.ProgramState
    cells: list = field(default_factory=list)
    pin: Optional[int] = None
    cell_ids: set = field(default_factory=set)
    last_cell_id: Optional[str] = None
    before: Any = None


@dataclass
class Totals:
    """Token counts of every ``%%lm`` cell run in this kernel (the ``%lm stats`` figures): the cells
    by how they ended, the tokens of all of them (a failed or stopped cell's requests ran too)."""

    done: int = 0
    failed: int = 0
    stopped: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0

    def add(self, prompt_tokens: int, cached_tokens: int, completion_tokens: int, status: str) -> None:
        """Count one cell's tokens; ``status``: how it ended, ``"done"``, ``"error"`` or
        ``"interrupted"`` (``CellOutcome.status``). Raises ``ValueError`` for another status."""
        field = {"done": "done", "error": "failed", "interrupted": "stopped"}.get(status)
        if field is None:
            raise ValueError(f"unknown cell status {status!r}; expected 'done', 'error' or 'interrupted'")
        setattr(self, field, getattr(self, field) + 1)
        self.prompt_tokens += prompt_tokens
        self.cached_tokens += cached_tokens
        self.completion_tokens += completion_tokens


# Why %lm pin and %lm tree cannot work on a server (Session.engine's ``why``; {api}: the API the
# session speaks to it).
NO_PIN_ROUTE = "{api}, which %lm connect speaks, has no route to pin a prefix in the server's cache"
NO_TREE_ROUTE = "{api}, which %lm connect speaks, has no route to read the server's radix tree"
# (%lm flush and %lm tree before the first cell: a note, so a Run All that begins with them goes on)
NOT_STARTED = "no engine has been started (it starts with the first %%lm cell, or %lm load MODEL)"


class Session:
    """Backend, named states and pins of one kernel. All methods are called from the main thread;
    ``close`` may also be called from the kernel's shutdown handler."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self.config = EngineConfig()
        self._backend = None
        self.remote: Optional[str] = None  # description of a connected server, if any
        self.states: dict[str, NamedState] = {}
        self.totals = Totals()

    # -- backend ----------------------------------------------------------------------------------
    @property
    def started(self) -> bool:
        """Whether a backend (engine or server) has been made."""
        return self._backend is not None

    @property
    def made_backend(self):
        """The backend cells run on now, None before one is made; unlike ``backend()``, it starts none."""
        return self._backend

    def current(self) -> str:
        """What cells run on now, in words (for messages)."""
        if self.remote is not None:
            return self.remote
        engine = f"the in-process engine on {self.config.describe()}"
        return engine if self._backend is not None else engine + " (it starts with the first %%lm cell)"

    def backend(self):
        """The lmnb backend cells run on; the first call starts the in-process engine.

        Raises ``CellError`` if the model cannot be loaded (the message names the model and why).
        """
        with self._lock:
            if self._backend is None:
                with interrupt_after():  # the engine is kept: the next cell need not load it again
                    # (from a %%lm cell, whose own options are not %lm load's)
                    self._backend = self._start_engine(self.config, "%lm load")
            return self._backend

    def _start_engine(self, config: EngineConfig, command: str = ""):
        """A backend of a new in-process engine built from ``config``; its load error is a
        ``CellError`` naming the load options, as ``command``'s where it shows up elsewhere (the
        first ``%%lm`` cell starts the engine)."""
        import lmnb

        with _load_errors(config, command):
            backend = lmnb.Engine(config.model_name(), **config.engine_kwargs())
        # (a cell's request errors: they show in the cell, where the kernel's states are pinned by magics)
        backend.front_end_options = (_LOAD_OPTIONS, "%lm load", {
            UNPIN: "unpin a state with %lm unpin NAME (%lm states shows which are pinned)"})
        backend.on_guessed_template = say_no_chat_template
        return backend

    def engine(self, what: str, why: str = ""):
        """The in-process ``lmnb_engine.Engine`` (for ``what``, e.g. ``"%lm stats"``; ``why``: why
        a server cannot do it, said when the session is connected to one; ``{api}`` in it names the
        API the session speaks to the server).

        Raises ``CellError`` if none is running yet or the session is connected to a server.
        """
        if self.remote is not None:
            from lmnb.backend.runtime_endpoint import RuntimeEndpoint

            api = "SGLang's server API" if isinstance(self._backend, RuntimeEndpoint) else "the OpenAI-compatible API"
            why = why.format(api=api)
            raise CellError(f"{what} needs the in-process engine{f' ({why})' if why else ''}; this kernel is "
                            f"connected to {self.remote} (use {self.config.load_line()} to go back to an in-process "
                            "engine)")
        if self._backend is None:
            raise CellError(f"{what}: the engine starts with the first %%lm cell (or %lm load MODEL); none is running yet")
        return self._backend.engine

    def load(self, config: EngineConfig) -> None:
        """Replace the backend with a new in-process engine built from ``config`` (loaded now),
        dropping the named states (they ran on the old backend, whose cache goes with it).

        Where the old backend is an in-process engine on the GPU the new one is to load on
        (``shared_accelerator``), the old engine is closed and its memory freed first
        (``lmnb_engine.Engine.release_memory``): it held its weights and a KV pool of most of the
        GPU's free memory (``mem_fraction``, 0.8 on CUDA), so the new engine's weights were refused
        ("free the GPU") or its pool sized from what little was left, and only a kernel restart
        helped. Loading first and closing the old engine on a memory refusal alone would not
        catch the second case, a load that succeeds with a pool too small for the work, and
        loads twice. What of the checkpoint can fail before any memory is taken (``check_model``:
        no such checkpoint, an unsupported architecture, a bad dtype or device), and a
        ``max_total_tokens`` below lmnb's least pool (``pool_floor.refuse_a_pool_too_small_to_load``:
        from the new checkpoint's tokenizer and config, no weights), is checked before that close,
        so it keeps the old engine. Elsewhere (CPU, another GPU, a server) the new backend loads first and a
        failed load keeps the old one: on CPU the pool takes a tenth of the available RAM, capped,
        and no weight check refuses a second model.

        Raises:
            CellError: the load failed (the message names the model and why); where the old engine
                was closed first it says so and gives the ``%lm load`` line that brings it back,
                and ``config`` stays the old engine's, which the next ``%%lm`` cell starts again.
        """
        with self._lock, interrupt_after():
            device = shared_accelerator(self._backend, config)  # (None for a server's)
            if device is None:
                backend = self._start_engine(config)
                self.close()
            else:
                from lmnb.ir import DEFAULT_MAX_NEW_TOKENS
                from lmnb_engine.model_loader import check_model  # (torch is imported: an engine is on CUDA)
                from lmnb_engine.pool_floor import refuse_a_pool_too_small_to_load

                # (a mistyped path, a bad --dtype, a --max-total-tokens too small must not cost the old engine;
                # the pool's check reads the checkpoint's config with check_model's checks, so it is read once)
                with _load_errors(config):
                    if config.max_total_tokens is None:
                        check_model(config.model_name(), config.device, config.dtype, config.random_weights)
                    else:
                        refuse_a_pool_too_small_to_load(config.max_total_tokens, DEFAULT_MAX_NEW_TOKENS,
                                                        config.model_name(), config.device, config.dtype,
                                                        config.random_weights)
                dropped = sorted(self.states)
                kept = self._close_and_free()
                try:
                    backend = self._start_engine(config)
                except CellError as e:
                    states = f"; named states dropped: {', '.join(dropped)}" if dropped else ""
                    raise CellError(f"{e}\nthe engine on {self.config.describe()} was closed first, to free {device} "
                                    f"for the new model{kept}{states}; {self.config.load_line()} loads it again"
                                    ) from e.__cause__
            self.config, self._backend, self.remote = config, backend, None

    def _close_and_free(self) -> str:
        """Drop named states and shut the in-process engine down, waiting for it, then free its
        device memory (``release_memory``), whatever still refers to it. Returns "" or, where a
        step it was in kept its memory, a clause saying so (for the message of a load that fails)."""
        backend, self._backend = self._backend, None
        self.states.clear()
        try:
            backend.engine.release_memory()
        except RuntimeError as e:
            return f" (its memory is still held: {e})"
        return ""

    def connect(self, backend, description: str, timeout: float = 2.0) -> None:
        """Replace the backend with ``backend`` (an lmnb backend for a server, described for users),
        dropping the named states, then shut the old one down, waiting at most ``timeout`` seconds.

        A Ctrl-C leaves one of two states, and says which; never none (the old backend's shutdown
        was waited for first, and a press in that wait left the session with no backend: the next
        ``%%lm`` cell loaded an in-process engine, and the new server's client was never closed).

        Raises:
            KeyboardInterrupt: bare, for a press before the swap, which is made with Ctrl-C held:
                the connect is cancelled, the old backend and the named states are kept, and
                ``backend`` is shut down. As ``cell_interrupt`` (one line saying so) for a press
                during or after the swap: ``backend`` is in place, and the old backend's shutdown,
                no longer waited for, goes on in the background.
        """
        swapped = False
        try:
            with self._lock:
                with held_interrupts() as held:
                    old, self._backend, self.remote = self._backend, backend, description
                    self.states.clear()
                    swapped = True
                    shutting = _shut_down_in_background(old)
                if not held:
                    if shutting is not None:
                        thread_join(shutting, timeout)  # (sliced: a press that lands as it begins stops it)
                    return
        except KeyboardInterrupt:
            if not swapped:
                _shut_down_in_background(backend)  # (its client: it was never used)
                raise
        raise cell_interrupt(f"%lm connect was stopped as the old backend shut down; cells run on {description} now "
                             "(the old backend's shutdown goes on in the background)")

    def close(self, timeout: float = 2.0) -> None:
        """Drop named states and shut the backend down, waiting at most ``timeout`` seconds.

        Named states belong to the backend they ran on, so they go with it. A server the session was
        connected to is forgotten too: the next ``%%lm`` cell starts the in-process engine on
        ``config``, as ``current()`` then says (it named the closed server, and ``%lm stats`` said
        cells ran on it).
        """
        with self._lock:
            backend, self._backend, self.remote = self._backend, None, None
            self.states.clear()
        done = _shut_down_in_background(backend)
        if done is not None:
            done.join(timeout)

    # -- named states -----------------------------------------------------------------------------
    def state(self, name: str) -> NamedState:
        """The named state ``name``; ``CellError`` listing the known names if there is none."""
        try:
            return self.states[name]
        except KeyError:
            known = ", ".join(sorted(self.states)) or "none yet"
            raise CellError(f"no state named {name!r} (known: {known}); create it with %%lm --state {name}") from None

    def keep(self, name: str, state, cell: Optional[int], cell_id: Optional[str] = None,
             replace: bool = False) -> NamedState:
        """Store ``state``, which cell ``cell`` (execution count; Jupyter cell id ``cell_id``) ran,
        under ``name``. With ``replace`` it ran from the state as it was before that same cell's
        previous run (``NamedState.before``), and that run's turn is gone. A pinned state stays
        pinned: the pin moves to the new text (if that fails the old prefix stays pinned)."""
        old = self.states.get(name)
        if old is None:
            cells, before = [], None
        elif replace:
            cells, before = old.cells[:-1], old.before
        else:
            cells, before = old.cells, old.state
        named = NamedState(name, state, cells + ([cell] if cell is not None else []), old.pin if old else None,
                           (old.cell_ids if old else set()) | ({cell_id} if cell_id is not None else set()),
                           cell_id, before)
        self.states[name] = named
        if named.pin is not None:
            try:
                self.pin(name)
            except CellError:
                pass
        return named

    def drop(self, name: Optional[str] = None) -> list[str]:
        """Forget one named state (or all), unpinning them; returns the names dropped."""
        names = [name] if name is not None else list(self.states)
        for n in names:
            named = self.state(n)
            if named.pin is not None:
                self.unpin(n)
            del self.states[n]
        return names

    def pin(self, name: str) -> int:
        """Pin the named state's prefix in the engine's radix cache; returns its token count.

        The pinned prefix is the state's text (with its images) as the engine tokenizes it, which
        is what the next cell continuing the state sends; it is not evicted until ``unpin``.
        """
        named = self.state(name)
        engine = self.engine("%lm pin", NO_PIN_ROUTE)
        try:
            ids = self.prompt_ids(named.state)
            if not ids:
                raise CellError(f"state {name!r} is empty; there is nothing to pin")
            handle = engine.pin_prefix(ids)
        except (RuntimeError, ValueError) as e:
            # (the engine's fixes, e.g. a pool too small, as a cell's request error says them: %lm load's options)
            raise CellError(f"could not pin state {name!r}: {self._backend._worded(e)}") from e
        # (a stop between the two lost a handle, whose pin was never released; the old pin's release
        # is only posted while Ctrl-C is held, and waited for after: a long step held every press)
        def take_the_new_pin():
            old, named.pin = named.pin, handle
            return engine.queue_unpin(old) if old is not None else None

        try:
            stopped = _changed_with_ctrl_c_held(take_the_new_pin)
        except KeyboardInterrupt:  # (before the hold: the state keeps its pin, and no one holds the new one)
            with contextlib.suppress(RuntimeError):  # (shut down meanwhile: its pins went with it)
                engine.queue_unpin(handle)
            raise
        if stopped:  # (a Run-All stops here all the same)
            raise cell_interrupt(f"%lm pin was stopped once state {name!r} was pinned")
        return len(ids)

    def prompt_ids(self, state) -> list:
        """The prompt of ``state`` (a ``ProgramState``) as the in-process engine takes it: its
        text's token ids (``Engine.prompt_ids``), or [issue 10] with its images the prepared ids (``MultimodalTokens``),
        where each image is as many placeholder tokens as the model gives it (the text holds one
        per image).

        Raises ``CellError`` if no engine is running; ``ValueError`` if an image cannot be read."""
        engine = self.engine("the state's prompt")
        text, images = state.text(), tuple(state.stream_executor.images_)
        if not images:
            return engine.prompt_ids(text)  # (a text writing its own BOS runs with that one alone)
        from lmnb.backend.base import Prompt

        return self._backend._engine_prompt(Prompt(text, images=images))[0]

    def unpin(self, name: str) -> None:
        """Let named state ``name``'s prefix be evicted again (``%lm unpin``)."""
        named = self.state(name)
        if named.pin is None:
            raise CellError(f"state {name!r} is not pinned, so there is nothing to unpin; %lm states shows which "
                            "states are pinned")
        engine = self.engine("%lm unpin")
        # (the engine releases the pin between its steps, waited for or not: a stop in that wait left
        # the state holding the handle, and the next %lm unpin failed on it as unknown; so the
        # release is posted and the handle dropped while Ctrl-C is held, and waited for after)
        def drop_the_pin():
            released, named.pin = engine.queue_unpin(named.pin), None
            return released

        if _changed_with_ctrl_c_held(drop_the_pin):  # (a Run-All stops here all the same)
            raise cell_interrupt(f"%lm unpin was stopped; state {name!r}'s pin is released all the same, between "
                                 "the engine's steps")


@contextlib.contextmanager
def _load_errors(config: EngineConfig, command: str = ""):
    """Turn a failed load of ``config`` (or its ``check_model``) into a ``CellError`` naming the
    model and the load options, as ``command``'s where it shows up elsewhere."""
    try:
        yield
    except (OSError, ValueError, RuntimeError, ImportError) as e:
        # Only a checkpoint that cannot be found calls for another model, and only where the
        # engine's message has no fix of its own (dtype, memory, a hub id to download...).
        hint = ("\nfix: %lm load PATH_OR_HF_ID (a local Hugging Face checkpoint directory or hub id)"
                if isinstance(e, OSError) and "Fix: " not in str(e) else "")
        if hint and not config.model and os.environ.get(MODEL_ENV):  # (every plain %lm load reads it again)
            hint += (f"; or point ${MODEL_ENV} at a checkpoint (%env {MODEL_ENV}=PATH), or remove it for the "
                     f"demo model (del os.environ['{MODEL_ENV}'])")
        raise CellError(f"could not load {config.describe()}: {type(e).__name__}: "
                        f"{in_option_syntax(e, _LOAD_OPTIONS, command)}{hint}") from e


def shared_accelerator(backend, config: EngineConfig) -> Optional[str]:
    """The CUDA device (e.g. ``"cuda:0"``) that ``backend``, an in-process engine, runs on and that
    an engine built from ``config`` would load on too; None where they share none (no backend, a
    server's, CPU, another GPU, or a ``config.device`` the engine will refuse: that load fails
    before it takes any memory, so the old engine is kept). ``config.device`` is read as the engine
    reads it (``model_loader.resolve_device``: None is its default); a bare ``"cuda"`` is the
    current CUDA device."""
    runner = getattr(getattr(backend, "engine", None), "runner", None)
    old = getattr(runner, "device", None)
    if old is None or old.type != "cuda":
        return None
    import torch  # (only with an engine on CUDA: torch and the engine's loader are imported already)

    from lmnb_engine.model_loader import resolve_device

    try:
        new = resolve_device(config.device)
    except ValueError:
        return None
    if new.type != "cuda":
        return None

    def index(device) -> int:
        return torch.cuda.current_device() if device.index is None else device.index

    return f"cuda:{index(old)}" if index(old) == index(new) else None


def _shut_down_in_background(backend) -> Optional[threading.Thread]:
    """Start ``backend.shutdown()`` on a daemon thread of its own (a server's waits for an abort in
    flight, a wedged one's up to its timeout), returned for the caller to wait for as long as it
    will; None where ``backend`` is None."""
    if backend is None:
        return None
    done = threading.Thread(target=backend.shutdown, name="lmnb-shutdown", daemon=True)
    done.start()
    return done


def _changed_with_ctrl_c_held(change) -> bool:
    """Run ``change()``, which changes a named state's pin and returns the future of the engine's
    release of the old one (``Engine.queue_unpin``, or None), with Ctrl-C held; then wait for that
    release. Returns whether Ctrl-C came meanwhile, or once the hold had ended (the release still
    happens): a press there was raised bare before, and said the pin was as it was.

    Raises:
        KeyboardInterrupt: Ctrl-C came before the hold began: ``change`` did not run.
        ValueError: the release's (an unknown handle).
    """
    changed = False
    try:
        with held_interrupts() as held:
            released = change()
            changed = True
        if held:  # (a press held while the release was posted stops it at once: a long step held it to its end)
            return True
        if released is not None:
            future_result(released)
    except KeyboardInterrupt:
        if not changed:
            raise
        return True
    return False


class SessionBackend:
    """Stands for the session's backend wherever lmnb wants one (``lmnb.set_default_backend``).

    Python code in the kernel (``prog.run()``, ``run_batch``) then uses the very engine the
    ``%%lm`` cells use, with its radix cache, instead of starting a second one; the engine still
    starts only when first needed, and ``%lm load`` / ``%lm connect`` switch both.
    """

    def __init__(self, session: "Session") -> None:
        self._session = session

    def __getattr__(self, name: str):
        return getattr(self._session.backend(), name)

    def __setattr__(self, name: str, value) -> None:
        # (a setting such as ``chat_template = lmnb.get_chat_template("chatml")`` is the backend's: kept
        # on this stand-in, reads would show it and runs, which use the backend, would not)
        if name.startswith("_"):
            object.__setattr__(self, name, value)
        else:
            setattr(self._session.backend(), name, value)

    def __repr__(self) -> str:
        return f"<lmnb kernel session backend: {self._session.remote or self._session.config.describe()}>"

    def on_replaced(self, backend) -> None:
        """``lmnb.set_default_backend(backend)`` took this one's place (the README's
        ``sgl.set_default_backend(sgl.Engine())`` pasted into a cell): say on stderr that Python
        programs have left the kernel's engine, and what a second in-process engine costs."""
        from lmnb.backend.engine import Engine

        second = isinstance(backend, Engine) and backend.engine is not getattr(self._session._backend, "engine", None)
        cost = ", a second copy of the model in memory with a radix cache of its own" if second else ""
        print(f"lmnb: warning: Python programs now run on {backend!r}{cost}, not on the kernel's engine that %%lm "
              "cells use (%lm stats counts only that one); in the lmnb kernel leave the default backend unset and "
              "choose the model with %lm load (a server with %lm connect), or pass backend= to run() for one "
              "program; lmnb.set_default_backend(None) goes back to the kernel's engine", file=sys.stderr)


_session: Optional[Session] = None
_session_lock = threading.Lock()


def say_no_chat_template(what: str) -> None:
    """``on_guessed_template`` of the session's engine or SGLang-protocol server (a model with no chat
    template): a line in the cell's output with the notebook's fix, not a Python warning (lmnb's
    file and line, and ``Engine(chat_template_name=...)``, which %lm load has no option for)."""
    print(f"lmnb: warning: {what}. Give its format in a Python cell: lmnb.get_default_backend().chat_template = "
          "lmnb.get_chat_template('chatml') (or another registered name), again after each %lm load or %lm connect",
          file=sys.stderr)


def get_session() -> Session:
    """The process-wide session (created empty on first use; nothing is loaded until needed)."""
    global _session
    with _session_lock:
        if _session is None:
            _session = Session()
        return _session
