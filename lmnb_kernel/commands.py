"""``%lm SUBCOMMAND``: the line magics that manage the session (engine, server, states, cache).

Each function takes the parsed arguments and the ``Session`` and displays a small static bundle.
"""

from __future__ import annotations

import contextlib
import sys

from IPython.display import display

import lmnb
from lmnb_engine import API_KEY_ENV
from lmnb_kernel.errors import CellError
from lmnb_kernel.session import NOT_STARTED, EngineConfig, Session, SessionBackend, say_no_chat_template
from lmnb_kernel.tables import cell_label, percent, table


def load(args, session: Session) -> None:
    """``%lm load [MODEL]``: start a new in-process engine now (named states are dropped); no MODEL:
    ``$LMNB_MODEL``, else the built-in demo model. An empty MODEL (``%lm load ''``) is refused:
    read as no MODEL, it loaded that default and dropped the named states without a word."""
    if args.model is not None and not args.model.strip():
        raise CellError(f"%lm load got an empty model path {args.model!r}; give a checkpoint folder or hub id, or "
                        "plain %lm load for $LMNB_MODEL or the built-in demo model")
    config = EngineConfig(model=args.model, device=args.device, dtype=args.dtype,
                          max_total_tokens=args.max_total_tokens, random_weights=args.random_weights)
    dropped = sorted(session.states)  # they ran on the old engine, whose cache goes with it
    try:
        session.load(config)
    except KeyboardInterrupt as e:
        if hasattr(e, "_render_traceback_"):  # held until the engine loaded (interrupt_after): still
            _show_loaded(session, config, dropped)  # say what loaded and which states went with the old one
        raise
    _show_loaded(session, config, dropped)


def _show_loaded(session: Session, config: EngineConfig, dropped: list[str]) -> None:
    info = session.engine("%lm load").model_info()
    rows = [(k, info[k]) for k in ("model_path", "architecture", "num_layers", "device", "dtype",
                                   "context_len", "max_total_tokens") if k in info]
    title = f"loaded {config.describe()}" + (f"; named states dropped: {', '.join(dropped)}" if dropped else "")
    display(table(title, ("setting", "value"), rows), raw=True)


def connect(args, session: Session) -> None:
    """``%lm connect URL``: run cells on a server (SGLang native protocol, or OpenAI-compatible)."""
    import lmnb
    from lmnb.backend.base import BackendAuthError, without_key_fix
    from lmnb.backend.openai import ContinueFinalMessageRefused

    if args.completion and not args.openai:
        raise CellError("%lm connect --completion goes with --openai MODEL")
    if args.continue_final_message and (args.completion or not args.openai):
        raise CellError("%lm connect --continue-final-message goes with --openai MODEL, a chat model (not with "
                        "--completion, whose gens go anywhere in the text already)")
    scheme, sep, _ = args.url.partition("://")
    if not sep or scheme.lower() not in ("http", "https"):
        example = f"http://{args.url}" if not sep else "http://HOST:PORT"
        raise CellError(f"%lm connect takes an http(s) URL, e.g. {example}; got {args.url!r}")
    v1 = args.url.rstrip("/").endswith("/v1")
    timeout = {"timeout": args.timeout} if args.timeout is not None else {}  # else each backend's default
    try:
        if args.openai:
            backend = lmnb.OpenAI(args.openai, base_url=args.url, api_key=args.api_key,
                                  is_chat_model=False if args.completion else None,
                                  continue_final_message=args.continue_final_message, **timeout)
            backend.key_fix = f"; {_openai_key_advice(args)}"  # (a cell's HTTP 401 says this, not the Python API)
            what = f"OpenAI-compatible server {args.url} (model {args.openai})"
            backend.on_guessed_template = _say_guessed_template
        else:  # (without --api-key it reads $LMNB_API_KEY: a key in the notebook is saved with it)
            backend = lmnb.RuntimeEndpoint(args.url, api_key=args.api_key, **timeout)
            backend.key_fix = f"; {_key_advice(args)}"  # (a cell's HTTP 401 says this, not the Python API)
            backend.on_guessed_template = say_no_chat_template
            what = f"SGLang-protocol server {args.url}"
    except ContinueFinalMessageRefused as e:  # (no connection failed: the flag cannot apply here)
        fix = ", and generate at the start of assistant messages ({assistant}{gen x}{/assistant})" if e.official else ""
        raise CellError(f"%lm connect --continue-final-message: {e.why}; leave it out{fix}") from None
    except Exception as e:  # the backends raise BackendError / httpx errors naming the cause
        hint = f"; {args.url} looks like an OpenAI API root: add --openai MODEL" if v1 and not args.openai else ""
        if isinstance(e, BackendAuthError):
            hint += f"; {_key_advice(args)}"
        raise CellError(f"could not connect to {args.url}: {without_key_fix(e)}{hint}") from e
    if args.openai:
        try:
            what += _served_models_note(backend, args, v1)
        except BaseException:  # (refused, or Ctrl-C as it waited for the server: the session keeps its backend)
            backend.shutdown()  # (else its client was left to the garbage collector to close)
            raise
    dropped = sorted(session.states)  # they ran on the old backend, as %lm load says
    try:
        session.connect(backend, what)
    except KeyboardInterrupt as e:
        if hasattr(e, "_render_traceback_"):  # stopped once connected (Session.connect): still say what it
            _show_connected(what, dropped)  # connected to and which states went with the old backend
        raise
    _show_connected(what, dropped)


def _show_connected(what: str, dropped: list[str]) -> None:
    msg = f"connected: {what}" + (f"; named states dropped: {', '.join(dropped)}" if dropped else "")
    display({"text/plain": msg, "text/html": f"<div>{_esc(msg)}</div>"}, raw=True)


def _say_guessed_template(what: str) -> None:
    """``lmnb.OpenAI.on_guessed_template`` for a connected completion model: a line in the cell's
    output with the fixes a notebook has, not a Python warning (its file, line and source)."""
    print(f"lmnb: warning: {what}. Connect to the server's root URL without --openai (%lm connect URL, for an "
          "lmnb serve or SGLang server), which uses the model's own template, or leave out --completion if it "
          "is a chat model, so the server applies its template", file=sys.stderr)


def _key_advice(args) -> str:
    """How ``%lm connect URL`` (``args``, no ``--openai``) gives the API key a server refused (HTTP
    401), or that the key sent was refused: at connect and in a cell's error."""
    from lmnb.backend.base import key_advice

    return key_advice("the --api-key given" if args.api_key else None, API_KEY_ENV,
                      f"%lm connect URL --api-key KEY, or set ${API_KEY_ENV} in the kernel's environment")


def _openai_key_advice(args) -> str:
    """How ``%lm connect URL --openai MODEL`` (``args``) gives the API key a server refused (HTTP
    401), or that the key sent was refused: at connect and in a cell's error."""
    from lmnb.backend.base import key_advice
    from lmnb.backend.openai import KEY_ENV

    # (the openai client reads $OPENAI_API_KEY; the SGLang protocol's $LMNB_API_KEY is not sent here)
    return key_advice("the --api-key given" if args.api_key else None, KEY_ENV,
                      f"%lm connect URL --openai MODEL --api-key KEY, or set ${KEY_ENV} in the kernel's environment "
                      f"(with --openai, ${API_KEY_ENV} is not read)")


def _served_models_note(backend, args, v1: bool) -> str:
    """Check the OpenAI server at connect time (``GET /models``), so a wrong URL or model name is
    named now rather than by the first cell. Returns a note for the "connected" line.

    Raises:
        CellError: the server does not answer there, or does not serve ``args.openai``.
    """
    import openai

    from lmnb.backend.openai import connect_timed_out, serves_unlisted

    try:
        served = [m.id for m in backend.client.with_options(timeout=10, max_retries=0).models.list()]
    except Exception as e:  # openai's APIError / APIConnectionError name the cause
        # no connection at all (refused, or a connect timeout: a firewalled host), vs a server that
        # took the connection but gave no model list (some proxies; a read timeout)
        unreachable = isinstance(e, openai.APIConnectionError) and (
            not isinstance(e, openai.APITimeoutError) or connect_timed_out(e))
        if isinstance(e, openai.AuthenticationError):  # 401: every cell would fail alike (a 403 may be a
            # key allowed to generate but not to list models, as OpenAI's restricted project keys are)
            raise CellError(f"could not connect to {args.url}: GET /models: HTTP {e.status_code} ({e}); "
                            f"{_openai_key_advice(args)}") from e
        if v1 and not unreachable:
            return f"; could not list its models ({type(e).__name__})"
        if unreachable:
            raise CellError(f"could not connect to {args.url}: nothing answers there ({e}); is the server "
                            "running, and the host and port right?") from e
        raise CellError(f"could not connect to {args.url}: GET /models failed ({type(e).__name__}: {e}); "
                        f"OpenAI-compatible servers serve the API under /v1, e.g. {args.url.rstrip('/')}/v1") from e
    if args.openai not in served and not serves_unlisted(backend.client, args.openai):
        raise CellError(f"{args.url} does not serve model {args.openai!r} (it serves: {', '.join(served) or 'none'}); "
                        "pass one of those to --openai")
    return ""


def stats(args, session: Session) -> None:
    """``%lm stats``: the engine's cache and pool figures and this kernel's token totals (only the
    totals before the engine starts, or when cells run on a server); its title says what cells run on."""
    t = session.totals
    totals = [  # (a cell that failed or was stopped ran requests too: its tokens are counted)
        ("%%lm cells run: done / failed / stopped", f"{t.done} / {t.failed} / {t.stopped}"),
        ("cell tokens: prompt / cached / completion", f"{t.prompt_tokens} / {t.cached_tokens} / {t.completion_tokens}"),
    ]
    default = lmnb.global_config.default_backend  # (read without starting one)
    if default is not None and not isinstance(default, SessionBackend):  # (set_default_backend replaced the kernel's)
        totals.append(("Python programs run on", f"{default!r} (lmnb.set_default_backend), not counted here"))
    if session.remote is not None or not session.started:  # informational: never stop a Run-All
        title = (f"cells run on {session.remote}, whose cache figures are not shown here" if session.remote
                 else f"lmnb engine: not started yet; the first %%lm cell starts it on {session.config.describe()} "
                      "(or %lm load MODEL)")
        display(table(title, ("", "value"), totals), raw=True)
        return
    s = session.engine("%lm stats").cache_stats()
    rows = [
        ("hit rate (engine, since load or %lm flush)", percent(s["cached_tokens"], s["prompt_tokens"])),
        ("prompt tokens / cached", f"{s['prompt_tokens']} / {s['cached_tokens']}"),
        ("KV pool used / size (tokens)", f"{s['pool_used']} / {s['pool_size']}"),
        ("free / evictable / protected", f"{s['free_tokens']} / {s['evictable_tokens']} / {s['protected_tokens']}"),
        ("evicted tokens", s["evicted_tokens"]),
        ("pinned prefixes", s["pinned_prefixes"]),
        ("running / waiting requests", f"{s['running_requests']} / {s['waiting_requests']}"),
        *totals,
    ]
    # (the model named: nothing else said which engine cells run on after a few %lm load / connect lines)
    display(table(f"lmnb engine on {session.config.describe()}", ("", "value"), rows), raw=True,
            metadata={"lmnb": {"stats": s}})


def states(args, session: Session) -> None:
    """``%lm states``: the named states, their size, variables and pins."""
    engine = session.engine("%lm states") if session.started and session.remote is None else None
    rows = []
    for named in session.states.values():
        text = named.state.text()
        tokens = "?"
        if engine is not None:
            with contextlib.suppress(ValueError):  # an image that cannot be read any more
                tokens = len(session.prompt_ids(named.state))
        variables = ", ".join(named.state.stream_executor.variables) or "-"
        cells = ", ".join(map(cell_label, named.cells)) or "-"
        rows.append((named.name, cells, len(text), tokens, variables, "yes" if named.pin is not None else "no"))
    title = "named states" if rows else "named states: none yet (create one with %%lm --state NAME)"
    display(table(title, ("name", "cells", "chars", "tokens", "variables", "pinned"), rows), raw=True)


def reset(args, session: Session) -> None:
    """``%lm reset [NAME]``: forget one named state, or all of them."""
    names = session.drop(args.name)
    msg = f"dropped state(s): {', '.join(names)}" if names else "no named states"
    display({"text/plain": msg, "text/html": f"<div>{_esc(msg)}</div>"}, raw=True)


def flush(args, session: Session) -> None:
    """``%lm flush``: evict every unpinned prefix from the radix cache: the in-process engine's, or
    the server's (``POST /flush_cache``) when connected to an SGLang-protocol server. Before any
    engine has started it only says so (nothing is cached), and starts none.

    Raises:
        CellError: requests are running; the server refused or failed the flush; the session is
            connected to an OpenAI-compatible server, whose API cannot flush a cache.
    """
    if session.remote is not None:
        return _flush_server(session)
    if not session.started:  # a note, not an error: a Run All that begins with %lm flush goes on
        return say(f"nothing cached yet: {NOT_STARTED}")
    if not session.engine("%lm flush").flush_cache():
        raise CellError("%lm flush: requests are still running; try again when they are done")
    msg = "radix cache flushed (pinned prefixes stay); the engine's hit-rate counters start again"
    display({"text/plain": msg, "text/html": f"<div>{msg}</div>"}, raw=True)


def say(msg: str) -> None:
    """Display one line of text (also as escaped HTML)."""
    display({"text/plain": msg, "text/html": f"<div>{_esc(msg)}</div>"}, raw=True)


def _flush_server(session: Session) -> None:
    """``%lm flush`` on the server the session is connected to (see ``flush``)."""
    import lmnb
    from lmnb.backend.base import BackendError

    backend = session.backend()
    if not isinstance(backend, lmnb.RuntimeEndpoint):
        raise CellError(f"%lm flush: {session.remote} speaks the OpenAI-compatible API, which has no route to "
                        "flush the server's prefix cache; flush it on the server (SGLang and lmnb serve: POST /flush_cache "
                        "at the server's root URL), or %lm connect to that root URL without --openai")
    try:
        backend.flush_cache()
    except BackendError as e:  # the server's words: e.g. HTTP 409, requests are running
        raise CellError(f"%lm flush: {e}") from None
    msg = f"the server's radix cache flushed ({session.remote}); cells after this one prefill their prompts afresh"
    display({"text/plain": msg, "text/html": f"<div>{_esc(msg)}</div>"}, raw=True)


def pin(args, session: Session) -> None:
    """``%lm pin NAME``: keep the named state's prefix in the cache (never evicted until unpinned)."""
    n = session.pin(args.name)
    msg = f"pinned state {args.name!r}: {n} tokens stay cached"
    display({"text/plain": msg, "text/html": f"<div>{_esc(msg)}</div>"}, raw=True)


def unpin(args, session: Session) -> None:
    """``%lm unpin NAME``: let the named state's prefix be evicted again."""
    session.unpin(args.name)
    msg = f"unpinned state {args.name!r}"
    display({"text/plain": msg, "text/html": f"<div>{_esc(msg)}</div>"}, raw=True)


def _esc(text: str) -> str:
    import html

    return html.escape(text)
