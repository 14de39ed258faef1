"""``lmnb serve``: the in-process engine over HTTP — SGLang's native protocol and the OpenAI API.

``serve_arguments(parser)`` / ``serve(args)`` are the CLI entry (``lmnb_kernel.cli``);
``create_app(engine, api_key=None, served_model_name=None, max_body_mb=256, incremental_streaming_output=False)`` builds the ASGI app for any engine
with ``lmnb_engine.Engine``'s surface, its handles' ``subscribe`` included (tests pass a small one). Importing this package loads neither fastapi nor torch.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys

from lmnb_engine import API_KEY_ENV, MODEL_ENV, model_or_env
from lmnb_engine.cli_options import Once, in_option_syntax, pool_tokens, tcp_port

DEFAULT_PORT = 30000  # SGLang's default
# The largest request body read, in MiB, unless ``--max-body-mb`` says otherwise: room for a long
# context's text many times over and for images inline as base64 (/generate's image_data), while a
# client cannot make the server hold gigabytes (a body is read whole before it is parsed).
DEFAULT_MAX_BODY_MB = 256
# uvicorn's names (uvicorn.config.LOG_LEVELS), listed here so a misspelt one is refused by argparse
# before the model loads; uvicorn itself fails on it with a KeyError traceback after the load.
LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")
# What ``serve`` is doing: "loading" (until the model is loaded and the port listens), "serving"
# (from its "serving" line), "shutting down" (the engine, once the server has stopped). A SIGTERM
# outside the server's own handlers (``app.Server.run``) ends the command with a line that says
# which (``lmnb_kernel.cli.main``): it came during the load, or after the server stopped.
phase = "loading"
# The exception a SIGTERM or Ctrl-C raised (``lmnb_kernel.cli``'s handler sets it), which a library the load
# runs may turn into another: transformers' lazy imports, cut short by it, raised
# ModuleNotFoundError "Could not import module 'LlamaConfig'", and serve reported a config.json
# that transformers could not parse, exit 2, for a stop asked for. ``serve`` raises it again.
stop_raised: BaseException | None = None


def serve_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``lmnb serve`` options to ``parser``."""
    parser.add_argument("--model", action=Once, default=None,
                        help=f"HF checkpoint directory or hub id, or demo (default: ${MODEL_ENV}, else the demo model)")
    parser.add_argument("--host", action=Once, default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    parser.add_argument("--port", action=Once, type=tcp_port, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0: a free one, named in the 'serving' line)")
    parser.add_argument("--api-key", action=Once, default=None,
                        help=f"require 'Authorization: Bearer KEY' on every request but GET /health (default: "
                             f"${API_KEY_ENV}, which keeps the key out of ps and the shell's history; unset or "
                             f"empty: no key)")
    parser.add_argument("--served-model-name", action=Once, default=None, help="model name in the OpenAI API (default: the model path)")
    parser.add_argument("--device", action=Once, default=None, help="cpu or cuda (default: cuda when available)")
    parser.add_argument("--dtype", action=Once, default=None, help="float32, bfloat16 or float16 (default: bfloat16 on cuda, float32 on cpu)")
    parser.add_argument("--max-total-tokens", action=Once, type=pool_tokens, default=None, help="KV cache size in tokens (default: from the free memory)")
    parser.add_argument("--max-body-mb", action=Once, type=float, default=DEFAULT_MAX_BODY_MB,
                        help=f"refuse request bodies larger than this many MiB with a 413 (default {DEFAULT_MAX_BODY_MB})")
    parser.add_argument("--incremental-streaming-output", action="store_true",
                        help="send only the new text, output_ids and output logprobs in each /generate stream chunk "
                             "(SGLang's option; default: everything so far in each chunk, which SGLang clients read)")
    parser.add_argument("--log-level", action=Once, default="info", type=str.lower, choices=LOG_LEVELS,
                        help=f"uvicorn log level: {', '.join(LOG_LEVELS)} (default info)")


def create_app(engine, api_key=None, served_model_name=None, max_body_mb=DEFAULT_MAX_BODY_MB,
               incremental_streaming_output=False):
    """See ``lmnb_engine.http_server.app.create_app``."""
    from lmnb_engine.http_server.app import create_app as _create_app

    return _create_app(engine, api_key=api_key, served_model_name=served_model_name, max_body_mb=max_body_mb,
                       incremental_streaming_output=incremental_streaming_output)


def bind(host: str, port: int):
    """A socket bound to ``host:port`` (port 0: a free port the system picks), not yet listening,
    or a message saying why it cannot be (a host that does not resolve, a port in use). Bound
    before the model loads, so that a bad address is named at once (uvicorn would find out only
    after the load, and exit 3); listening only after it, so that meanwhile clients are refused at
    once, as by a server not yet started, rather than left waiting for an answer."""
    import errno
    import socket

    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
    except socket.gaierror as e:
        return f"the host does not resolve ({e.strerror}); give an address of this machine, e.g. 127.0.0.1"
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        sock.bind(address)
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            return "the port is in use (another server?); choose another --port"
        return f"{e.strerror or e}; give an address of this machine (--host) and a free --port"
    return sock


def _shutting_down() -> None:
    """``phase``: the server has stopped, and the engine is to be shut down."""
    global phase
    phase = "shutting down"


def serve(args: argparse.Namespace) -> int:
    """Load the model, then serve until interrupted (Ctrl-C, SIGTERM: the open requests are
    aborted, each told that the server shut down: ``app.Server``). Returns the exit status: 0,
    or after a signal the shell's status of a process it ended (130 for SIGINT, 143 for SIGTERM),
    having printed ``lmnb serve: stopped (SIGTERM)`` (stderr). (SIGTERM while the model loads, or
    while the engine shuts down once the server has stopped: ``phase``, ``lmnb_kernel.cli.main``.)

    The API key is ``--api-key``, else ``$LMNB_API_KEY`` (``API_KEY_ENV``; empty counts as unset),
    which a start-up line names as the key's source without showing it.

    Prints ``lmnb serve: serving MODEL on http://HOST:PORT`` (stderr) once the model is loaded: with
    ``--port 0`` that is how a caller learns the port the system picked."""
    global phase, stop_raised
    phase = "loading"  # first: a previous serve() in this process left "shutting down"
    stop_raised = None
    from lmnb_engine import Engine, SamplingParams
    from lmnb_engine.http_server.app import Server
    from lmnb_engine.pool_floor import pool_to_make, refuse_a_pool_too_small

    if not 0 <= args.port <= 65535:  # checked before the model loads, not by bind() after
        print(f"lmnb serve: --port {args.port} is not a TCP port; give 0-65535", file=sys.stderr)
        return 2
    if not 0 < args.max_body_mb < math.inf:  # (inf failed later, as an OverflowError traceback)
        print(f"lmnb serve: --max-body-mb {args.max_body_mb:g} must be more than 0 and finite", file=sys.stderr)
        return 2
    model = model_or_env(args.model)
    sock = bind(args.host, args.port)
    if isinstance(sock, str):
        print(f"lmnb serve: cannot listen on {args.host}:{args.port}: {sock}", file=sys.stderr)
        return 2
    api_key = args.api_key or os.environ.get(API_KEY_ENV) or None  # (an empty variable: unset)
    if api_key and not args.api_key:  # (where the key came from, never the key: it stays out of logs too)
        print(f"lmnb serve: asking every request but GET /health for the API key in ${API_KEY_ENV}", file=sys.stderr)
    if args.host not in ("127.0.0.1", "localhost", "::1") and not api_key:
        # a line of the command's own, not warnings.warn: that showed this file's path and source line
        print(f"lmnb serve: warning: serving on {args.host} without --api-key: anyone who can reach it can use "
              f"the model; add --api-key KEY or set ${API_KEY_ENV}", file=sys.stderr)
    with sock:
        try:
            engine = Engine(model=model, device=args.device, dtype=args.dtype,
                            max_total_tokens=pool_to_make(args.max_total_tokens))
            if args.max_total_tokens is not None:  # (as %lm load and a job refuse it: each default request failed;
                # a pool sized from free memory that small is all but never, and the engine's own floor names it)
                refuse_a_pool_too_small(engine, args.max_total_tokens, SamplingParams.max_new_tokens)
        except Exception as e:
            if stop_raised is not None:  # (the signal's exception, turned into this one by the load)
                raise stop_raised from None
            if not isinstance(e, (FileNotFoundError, ValueError)):
                raise
            # (a path the command line never named: say where it came from)
            source = f" (the model {model} came from ${MODEL_ENV}; --model names another)" if model != args.model else ""
            print(f"lmnb serve: {in_option_syntax(e, vars(args))}{source}", file=sys.stderr)
            return 2
        # from here on the engine is shut down however serve() ends (its scheduler thread stopped, its
        # memory freed), also where Ctrl-C or a SIGTERM comes before the server's own handlers
        try:
            app = create_app(engine, api_key=api_key, served_model_name=args.served_model_name,
                             max_body_mb=args.max_body_mb,
                             incremental_streaming_output=args.incremental_streaming_output)
            try:
                sock.listen(2048)  # (uvicorn's backlog)
            except OSError as e:  # another server began listening on the port while the model loaded
                print(f"lmnb serve: cannot listen on {args.host}:{args.port}: {e.strerror or e}", file=sys.stderr)
                return 2
            host, port = sock.getsockname()[:2]
            shown = f"[{host}]" if ":" in host else host
            phase = "serving"
            print(f"lmnb serve: serving {model or 'the demo model'} on http://{shown}:{port}", file=sys.stderr,
                  flush=True)
            # "shutting down" as the server has stopped, before it gives the handlers from before back:
            # set after its run, a signal in between (main's handler) was said as the one that stopped
            # it. (Not in `finally`: a signal raised before the server's handlers keeps the phase it
            # came in, which main's line says.)
            server = Server(app, stopped=_shutting_down, log_level=args.log_level)
            server.run(sockets=[sock])
        finally:
            engine.shutdown()
    if server.stop_signal is None:
        return 0
    # a stop asked for, said as one line; the shell's status of a process the signal ended (130 for
    # SIGINT, 143 for SIGTERM), which systemd and docker take for a normal stop
    print(f"lmnb serve: stopped ({signal.Signals(server.stop_signal).name})", file=sys.stderr)
    return 128 + server.stop_signal
