"""``%lm flush``, ``%lm pin`` and ``%lm tree`` while the kernel is connected to a server. ``%lm
flush`` refused ("needs the in-process engine"), though SGLang's server API (and ``lmnb serve``)
has ``POST /flush_cache``; it now flushes the server's cache. An OpenAI-compatible API has no such
route, and SGLang's none to pin a prefix or read the radix tree: those refuse, saying why."""

from __future__ import annotations

import types

import pytest

import lmnb
from lmnb.backend.base import BackendAuthError
from lmnb_kernel import commands
from lmnb_kernel.errors import CellError
from lmnb_kernel.magics import LMMagics
from lmnb_kernel.session import Session

import helpers_lang
from test_lang_server_responses import send, server  # noqa: F401 - fixtures


@pytest.fixture
def shown(monkeypatch):
    """What the commands display (their text/plain)."""
    out = []
    monkeypatch.setattr(commands, "display", lambda bundle, raw=False, **kw: out.append(bundle["text/plain"]))
    return out


def _connected(backend, what: str) -> Session:
    session = Session()
    session.connect(backend, what)
    return session


def test_flush_while_connected_flushes_the_servers_cache(server, shown):  # noqa: F811
    posts = []
    server.answer = lambda h, b: (posts.append(h.path), send(h, 200, b"Cache flushed.\n", "text/plain"))
    session = _connected(lmnb.RuntimeEndpoint(server.url), f"SGLang-protocol server {server.url}")
    commands.flush(None, session)
    assert posts == ["/flush_cache"]
    assert shown == [f"the server's radix cache flushed (SGLang-protocol server {server.url}); cells after this one "
                     "prefill their prompts afresh"]
    # refused while requests run (lmnb serve: 409; SGLang: 400): the server's words, and no "flushed"
    server.answer = lambda h, b: send(h, 409, b'{"success": false, "message": "Cache not flushed: requests are '
                                              b'running; retry when idle."}')
    with pytest.raises(CellError) as e:
        commands.flush(None, session)
    assert str(e.value) == (f"%lm flush: POST {server.url}/flush_cache: HTTP 409: Cache not flushed: requests are "
                            "running; retry when idle.")
    assert len(shown) == 1
    session.close()


def test_ctrl_c_while_flush_waits_for_the_server_says_what_became_of_its_cache(server, shown):  # noqa: F811
    """Ctrl-C while %lm flush waited for the server's answer said "%lm flush was stopped" alone; it
    now says that the server's cache is flushed if the request reached it (here it did: the server
    sends the SIGINT as it takes the request), else as it was, and that the flush can be run again."""
    import signal
    import threading

    posts = []

    def stop_then_flush(h, b):  # (on the server's thread)
        posts.append(h.path)
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
        send(h, 200, b"Cache flushed.\n", "text/plain")

    server.answer = stop_then_flush
    what = f"SGLang-protocol server {server.url}"
    session = _connected(lmnb.RuntimeEndpoint(server.url), what)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt) as e:
            LMMagics.run_command(types.SimpleNamespace(session=session), "flush")
    finally:
        signal.signal(signal.SIGINT, previous)
    assert e.value._render_traceback_() == [
        f"\x1b[0;31mKeyboardInterrupt\x1b[0m: %lm flush was stopped while it waited for {what}; the server's cache is "
        "flushed if the request reached it, else as it was; %lm flush can be run again"]
    assert posts == ["/flush_cache"]
    server.answer = lambda h, b: (posts.append(h.path), send(h, 200, b"Cache flushed.\n", "text/plain"))
    commands.flush(None, session)  # (run again: it flushes)
    assert posts == ["/flush_cache"] * 2 and shown[-1].startswith("the server's radix cache flushed")
    session.close()


def test_flush_on_an_openai_server_and_pin_and_tree_on_any_server_refuse_saying_why(server, shown):  # noqa: F811
    posts = []
    server.answer = lambda h, b: (posts.append(h.path), send(h, 200, b"{}"))
    what = f"OpenAI-compatible server {server.url}/v1 (model m)"
    session = _connected(lmnb.OpenAI("m", base_url=server.url + "/v1", api_key="k"), what)
    with pytest.raises(CellError) as e:
        commands.flush(None, session)
    assert str(e.value) == (f"%lm flush: {what} speaks the OpenAI-compatible API, which has no route to flush the "
                            "server's prefix cache; flush it on the server (SGLang and lmnb serve: POST /flush_cache at the "
                            "server's root URL), or %lm connect to that root URL without --openai")
    assert posts == [] and shown == []
    session.close()

    session = _connected(lmnb.RuntimeEndpoint(server.url), f"SGLang-protocol server {server.url}")
    session.states["chat"] = types.SimpleNamespace(name="chat", state=None, cells=[1], pin=None)
    with pytest.raises(CellError) as e:
        commands.pin(types.SimpleNamespace(name="chat"), session)
    assert str(e.value) == (
        "%lm pin needs the in-process engine (SGLang's server API, which %lm connect speaks, has no route to pin a "
        f"prefix in the server's cache); this kernel is connected to SGLang-protocol server {server.url} (use "
        "%lm load to go back to an in-process engine)")
    with pytest.raises(CellError) as e:
        LMMagics.show_tree(types.SimpleNamespace(session=session))
    assert str(e.value).startswith("%lm tree needs the in-process engine (SGLang's server API, which %lm connect "
                                   "speaks, has no route to read the server's radix tree); this kernel is connected")
    assert posts == [] and shown == []
    session.close()


def test_stats_while_connected_name_the_server_not_an_engine(server, shown):  # noqa: F811
    """Connected to a server, %lm stats was titled "lmnb engine: cells run on SGLang-protocol server
    ...", as if an engine of the kernel's ran the cells; the title names the server alone."""
    session = _connected(lmnb.RuntimeEndpoint(server.url), f"SGLang-protocol server {server.url}")
    commands.stats(None, session)
    [text] = shown
    assert text.splitlines()[0] == (f"cells run on SGLang-protocol server {server.url}, whose cache figures are not "
                                    "shown here")
    session.close()


def test_stats_after_a_connect_count_the_cells_the_kernel_ran_before_it(server, shown, monkeypatch):  # noqa: F811
    """The cell rows of %lm stats count every cell of the kernel, also those run on the backend it
    had before %lm connect, under the server's title (docs/cli.md says so): one cell of 7 prompt
    tokens, 3 cached, 5 generated, run before the connect, is still there after it."""
    # (no default backend set, as in a fresh kernel: one left by another test of the process, such
    # as the demo Engine a program run without backend= starts, adds its "Python programs run on" row)
    monkeypatch.setattr(lmnb.api, "_default_backend", None)
    session = Session()
    session.totals.add(7, 3, 5, "done")
    session.connect(lmnb.RuntimeEndpoint(server.url), f"SGLang-protocol server {server.url}")
    commands.stats(None, session)
    [text] = shown
    rows = {line.rsplit("  ", 1)[0].strip(): line.rsplit("  ", 1)[1].strip() for line in text.splitlines()[2:]}
    assert rows == {"%%lm cells run: done / failed / stopped": "1 / 0 / 0",
                    "cell tokens: prompt / cached / completion": "7 / 3 / 5"}
    session.close()


def test_pin_and_tree_on_an_openai_server_name_the_api_it_speaks(server, shown):  # noqa: F811
    """Connected with --openai, %lm pin and %lm tree said "SGLang's server API, which %lm connect
    speaks, has no route ...": the kernel speaks the OpenAI-compatible API there."""
    posts = []
    server.answer = lambda h, b: (posts.append(h.path), send(h, 200, b"{}"))
    what = f"OpenAI-compatible server {server.url}/v1 (model m)"
    session = _connected(lmnb.OpenAI("m", base_url=server.url + "/v1", api_key="k"), what)
    session.states["chat"] = types.SimpleNamespace(name="chat", state=None, cells=[1], pin=None)
    with pytest.raises(CellError) as e:
        commands.pin(types.SimpleNamespace(name="chat"), session)
    assert str(e.value) == (
        "%lm pin needs the in-process engine (the OpenAI-compatible API, which %lm connect speaks, has no route to "
        f"pin a prefix in the server's cache); this kernel is connected to {what} (use %lm load to go back to an "
        "in-process engine)")
    with pytest.raises(CellError) as e:
        LMMagics.show_tree(types.SimpleNamespace(session=session))
    assert str(e.value).startswith("%lm tree needs the in-process engine (the OpenAI-compatible API, which %lm "
                                   "connect speaks, has no route to read the server's radix tree); this kernel is "
                                   "connected")
    assert posts == [] and shown == []
    session.close()


@pytest.fixture
def keyed_server():
    with helpers_lang.keyed_server() as url:
        yield url


@pytest.mark.parametrize("key, env, advice", [
    (None, None, "; the server asks for an API key: %lm connect URL --api-key KEY, or set $LMNB_API_KEY in the "
                 "kernel's environment"),
    ("wrong", None, "; the server refused the --api-key given: check it"),
    (None, "wrong", "; the server refused the key in $LMNB_API_KEY: check it"),  # (a key kept out of the notebook)
])
def test_connect_to_a_server_that_wants_a_key_says_to_pass_it(key, env, advice, keyed_server, monkeypatch):
    """``%lm connect URL`` to ``lmnb serve --api-key K`` said "missing or wrong API key (send
    Authorization: Bearer <key>)", the server's words for an HTTP client, not how to give the key
    to %lm connect."""
    if env is None:
        monkeypatch.delenv("LMNB_API_KEY", raising=False)
    else:
        monkeypatch.setenv("LMNB_API_KEY", env)
    url = keyed_server
    session = Session()
    args = types.SimpleNamespace(url=url, api_key=key, openai=None, completion=False,
                                 continue_final_message=False, timeout=5)
    try:
        with pytest.raises(CellError) as e:
            commands.connect(args, session)
    finally:
        session.close()
    assert isinstance(e.value.__cause__, BackendAuthError)
    assert str(e.value) == (f"could not connect to {url}: GET {url}/get_model_info: HTTP 401: missing or wrong API "
                            f"key (send Authorization: Bearer <key>){advice}")


def test_connect_sends_the_key_in_lmnb_api_key(monkeypatch):
    """The key could be given only as --api-key, written in the notebook (and saved with it)."""
    import http.server as hs

    seen = []

    class Handler(hs.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_GET(self):
            seen.append(self.headers.get("Authorization"))
            helpers_lang.send(self, 401, b'{"error": {"message": "missing or wrong API key", "code": 401}}')

    monkeypatch.setenv("LMNB_API_KEY", "from-env")
    session = Session()
    try:
        with helpers_lang.serve_http(Handler) as url, pytest.raises(CellError):
            commands.connect(types.SimpleNamespace(url=url, api_key=None, openai=None, completion=False,
                                                   continue_final_message=False, timeout=5),
                             session)
    finally:
        session.close()
    assert seen and set(seen) == {"Bearer from-env"}


@pytest.mark.parametrize("key, env, advice", [
    (None, {}, "the server asks for an API key: %lm connect URL --openai MODEL --api-key KEY, or set $OPENAI_API_KEY "
               "in the kernel's environment (with --openai, $LMNB_API_KEY is not read)"),
    # (the openai client sends $OPENAI_API_KEY; the advice said to pass a key, though one was sent)
    (None, {"OPENAI_API_KEY": "old", "LMNB_API_KEY": "k"}, "the server refused the key in $OPENAI_API_KEY: check it"),
    ("wrong", {}, "the server refused the --api-key given: check it"),
])
def test_connect_openai_to_a_server_that_wants_a_key_fails_the_connect(key, env, advice, keyed_server, monkeypatch):
    """With --openai, a 401 on the model list connected anyway ("could not list its models
    (AuthenticationError)"), and then every cell failed with HTTP 401."""
    for name in ("OPENAI_API_KEY", "LMNB_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    url = f"{keyed_server}/v1"
    session = Session()
    args = types.SimpleNamespace(url=url, api_key=key, openai="m", completion=True,
                                 continue_final_message=False, timeout=5)
    with pytest.raises(CellError) as e:
        commands.connect(args, session)
    assert str(e.value).startswith(f"could not connect to {url}: GET /models: HTTP 401 ("), str(e.value)
    assert str(e.value).endswith(f"); {advice}"), str(e.value)
    assert session.remote is None  # still the in-process engine
    session.close()


@pytest.mark.parametrize("key, env, advice", [
    (None, {}, "the server asks for an API key: %lm connect URL --openai MODEL --api-key KEY, or set $OPENAI_API_KEY "
               "in the kernel's environment (with --openai, $LMNB_API_KEY is not read)"),
    (None, {"OPENAI_API_KEY": "old"}, "the server refused the key in $OPENAI_API_KEY: check it"),
    ("wrong", {}, "the server refused the --api-key given: check it"),
])
def test_a_cells_gen_refused_for_the_key_says_how_connect_gives_it(key, env, advice, server,  # noqa: F811
                                                                  monkeypatch):
    """A server that lists its models without the key (a proxy) but refuses gens without it (HTTP
    401): a connected cell's gen failed with a plain BackendError in the server's words for an HTTP
    client; it says %lm connect's options, not lmnb.OpenAI's api_key=, and once."""
    for name in ("OPENAI_API_KEY", "LMNB_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    server.model_info = b'{"object": "list", "data": [{"id": "m", "object": "model"}]}'
    server.answer = lambda h, b: send(h, 401, b'{"error": {"message": "missing or wrong API key (send '
                                              b'Authorization: Bearer <key>)", "code": 401}}')
    url = f"{server.url}/v1"
    session = Session()
    try:
        commands.connect(types.SimpleNamespace(url=url, api_key=key, openai="m", completion=True,
                                               continue_final_message=False, timeout=5),
                         session)
        error = str(_gen.run(backend=session.backend()).error())
    finally:
        session.close()
    assert error == (f"Gen('a') failed: BackendAuthError: {url}/completions: HTTP 401: missing or wrong API key (send "
                     f"Authorization: Bearer <key>); {advice}")


@pytest.mark.parametrize("key, env, advice", [
    (None, {}, "the server asks for an API key: %lm connect URL --api-key KEY, or set $LMNB_API_KEY in the kernel's "
               "environment"),
    (None, {"LMNB_API_KEY": "old"}, "the server refused the key in $LMNB_API_KEY: check it"),
    ("old", {}, "the server refused the --api-key given: check it"),
])
def test_a_cells_gen_refused_for_the_key_after_connect_says_how_connect_gives_it(key, env, advice,
                                                                                 server, monkeypatch):  # noqa: F811
    """An SGLang-protocol server that refuses the key only after the connect (restarted with
    another key, or a proxy guarding /generate alone): a connected cell's gen failed with the
    server's bare words, where a refusal at connect says how to give the key; it says %lm connect's
    options too, not lmnb.RuntimeEndpoint's api_key=, and once."""
    for name in ("OPENAI_API_KEY", "LMNB_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    server.answer = lambda h, b: send(h, 401, b'{"detail": "Invalid token"}')
    session = Session()
    try:
        commands.connect(types.SimpleNamespace(url=server.url, api_key=key, openai=None, completion=False,
                                               continue_final_message=False, timeout=5),
                         session)
        error = str(_gen.run(backend=session.backend()).error())
    finally:
        session.close()
    assert error == f"Gen('a') failed: BackendAuthError: POST {server.url}/generate: HTTP 401: Invalid token; {advice}"


@lmnb.function
def _gen(s):
    s += "Hi" + lmnb.gen("a", max_tokens=2)


_CHAT_TEMPLATE_GUESS = ("no chat template is known for the model name 'my-model', so the program's roles go out in "
                        "the generic 'default' format ('USER:...\\nASSISTANT:'), which the model may not be "
                        "trained on")


def _completion_server(server):  # noqa: F811
    """``server`` as an OpenAI-compatible server of the completion model 'my-model'."""
    server.model_info = b'{"object": "list", "data": [{"id": "my-model", "object": "model"}]}'
    server.answer = lambda h, b: send(h, 200, b'{"id": "x", "choices": [{"index": 0, "text": "ok", '
                                              b'"finish_reason": "stop"}]}')


@lmnb.function
def _chat(s):
    s += lmnb.user("Hi")
    s += lmnb.assistant(lmnb.gen("a", max_tokens=2))


def test_connect_completion_says_a_guessed_chat_template_once_as_a_line(server, shown, capsys):  # noqa: F811
    """%lm connect URL/v1 --openai M --completion: the guessed template was a UserWarning, shown in
    the cell with lmnb's file, line and source line, and with fixes of the Python API
    (chat_template=) that %lm connect has no option for. It is one line with the notebook's fixes,
    once however many rows of a batch's threads meet it."""
    import warnings

    _completion_server(server)
    session = Session()
    try:
        commands.connect(types.SimpleNamespace(url=server.url + "/v1", api_key=None, openai="my-model",
                                               completion=True, continue_final_message=False, timeout=5), session)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            warnings.simplefilter("ignore", ResourceWarning)  # (an unclosed socket of another test, collected here)
            _chat.run_batch([{}] * 6, backend=session.backend(), num_threads=6)
            _chat.run(backend=session.backend())
    finally:
        session.close()
    assert [str(w.message) for w in seen] == []
    assert capsys.readouterr().err == (
        f"lmnb: warning: {_CHAT_TEMPLATE_GUESS}. Connect to the server's root URL without --openai (%lm connect "
        "URL, for an lmnb serve or SGLang server), which uses the model's own template, or leave out --completion "
        "if it is a chat model, so the server applies its template\n")


def test_a_batch_jobs_completion_model_says_a_guessed_chat_template_once_as_a_line(server, capsys):  # noqa: F811
    """A job's --openai M --completion: one 'lmnb batch: warning:' line with the job's options as
    fixes (--chat-template first), not a UserWarning with lmnb's file and line, however many threads
    meet it; with --chat-template chatml the prompt is in that format, without a word."""
    import warnings

    from lmnb.batch.options import make_backend

    _completion_server(server)
    args = types.SimpleNamespace(backend=server.url + "/v1", openai="my-model", completion=True, api_key=None,
                                 timeout=5, model=None, device=None, dtype=None, max_total_tokens=None,
                                 chat_template=None, continue_final_message=False)
    backend = make_backend(args)
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            warnings.simplefilter("ignore", ResourceWarning)  # (an unclosed socket of another test, collected here)
            _chat.run_batch([{}] * 6, backend=backend, num_threads=6)
    finally:
        backend.shutdown()
    assert [str(w.message) for w in seen] == []
    assert capsys.readouterr().err == (
        f"lmnb batch: warning: {_CHAT_TEMPLATE_GUESS}; give its format with --chat-template NAME (e.g. --chat-template "
        "chatml, a name in SGLang's registry), or give --backend the server's root URL without --openai (an lmnb "
        "serve or SGLang server), which uses the model's own template, or leave out --completion if it is a chat "
        "model\n")
    prompts = []
    answer = server.answer
    server.answer = lambda h, b: (prompts.append(b["prompt"]), answer(h, b))[1]
    backend = make_backend(types.SimpleNamespace(**{**vars(args), "chat_template": "chatml"}))  # (the job's option)
    try:
        _chat.run(backend=backend)
    finally:
        backend.shutdown()
    assert prompts == ["<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"]  # (SGLang's chatml)
    assert capsys.readouterr().err == ""


@lmnb.function
def _prefilled(s):
    s += lmnb.user("Hi")
    s += lmnb.assistant("The answer is " + lmnb.gen("a", max_tokens=2))


def test_connect_continue_final_message_has_the_server_continue_a_partial_reply(server):  # noqa: F811
    """%lm connect URL --openai MODEL --continue-final-message: a gen after text inside an assistant
    message (refused on an OpenAI chat model before) sends the messages with that partial reply last
    and vLLM's continue_final_message / add_generation_prompt fields; the flag without --openai, or
    with --completion, is refused naming why."""
    from lmnb.template.cell_options import parse_backend_line

    bodies = []
    server.model_info = b'{"object": "list", "data": [{"id": "my-model", "object": "model"}]}'
    server.answer = lambda h, b: (bodies.append(b), send(h, 200, b'{"id": "x", "choices": [{"index": 0, "message": '
                                                                 b'{"role": "assistant", "content": "four"}, '
                                                                 b'"finish_reason": "stop"}]}'))
    session = Session()
    try:
        commands.connect(parse_backend_line("connect", [server.url + "/v1", "--openai", "my-model",
                                                        "--continue-final-message"]), session)
        state = _prefilled.run(backend=session.backend())
    finally:
        session.close()
    assert state.error() is None and state["a"] == "four"
    assert [(b["messages"], b["continue_final_message"], b["add_generation_prompt"]) for b in bodies] == [
        ([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "The answer is "}], True, False)]
    refused = ("%lm connect --continue-final-message goes with --openai MODEL, a chat model (not with --completion, "
               "whose gens go anywhere in the text already)")
    for words in ([server.url, "--continue-final-message"],
                  [server.url + "/v1", "--openai", "my-model", "--completion", "--continue-final-message"]):
        with pytest.raises(CellError) as e:
            commands.connect(parse_backend_line("connect", words), session=None)  # (refused before it is used)
        assert str(e.value) == refused


def test_a_cells_gen_after_text_in_a_chat_reply_is_told_the_way_a_cell_can_speculate(server):  # noqa: F811
    """A %%lm cell's gen after text inside an assistant reply, on an OpenAI chat model, was told "to
    fill text and several gens inside one reply use @function(num_api_spec_tokens=N)", which a cell
    cannot: it has no such option, and it streams, which API speculative execution refuses. The
    refusal says so and names the way (a Python cell's @lmnb.function(num_api_spec_tokens=N) and
    its .run()); that way runs the same program on the same connection, in one call."""
    from lmnb.template import parse
    from lmnb.template.cell_options import parse_backend_line
    from lmnb_kernel.cellrun import Listener, start_run

    bodies = []
    server.model_info = b'{"object": "list", "data": [{"id": "my-model", "object": "model"}]}'
    server.answer = lambda h, b: (bodies.append(b), send(h, 200, b'{"id": "x", "choices": [{"index": 0, "message": '
                                                                 b'{"role": "assistant", "content": "The answer is '
                                                                 b'four"}, "finish_reason": "stop"}]}'))
    session = Session()
    try:
        commands.connect(parse_backend_line("connect", [server.url + "/v1", "--openai", "my-model"]), session)
        template = parse("{user}Hi{/user}{assistant}The answer is {gen a max_tokens=2}{/assistant}")
        error = str(start_run(template.program(), template.bind({}), session.backend(), {}, Listener()).error())
        assert bodies == []  # (refused before any request)
        streamed = lmnb.function(num_api_spec_tokens=8)(_prefilled.func).run(backend=session.backend(), stream=True)
        assert "does not work with stream=True" in str(streamed.error())  # (why a cell cannot)
        state = lmnb.function(num_api_spec_tokens=8)(_prefilled.func).run(backend=session.backend())
    finally:
        session.close()
    assert error.startswith("Gen('a') failed: BackendCannotRun: an OpenAI chat model can only generate at the start "
                            "of an assistant message ")
    assert ("to fill text and several gens inside one reply use @function(num_api_spec_tokens=N), run without "
            "stream=True (a %%lm cell cannot: write the program in a Python cell as an "
            "@lmnb.function(num_api_spec_tokens=N) and call its .run()), or use a completion model") in error
    # (the reply after the fill, "four", cut at max_tokens=2: with no token boundaries in the answer, 2
    # characters stand for 2 tokens, SGLang's rule)
    assert state.error() is None and state["a"] == "fo"
    assert [b["messages"] for b in bodies] == [[{"role": "user", "content": "Hi"}]]


def test_connect_continue_final_message_where_it_cannot_apply_is_refused_in_the_magics_words():
    """--continue-final-message with OpenAI's own API, or a model name lmnb.OpenAI takes for a
    completion model, was refused as a failed connection in the Python API's words ("could not
    connect to https://api.openai.com/v1: lmnb.OpenAI continue_final_message=True: ...; leave it
    out, and ... use @function(num_api_spec_tokens=N)", which a %%lm cell has no way to use). It
    names the flag and a cell's fix; no request is sent (the URLs below are never reached)."""
    from lmnb.template.cell_options import parse_backend_line

    cases = {
        ("https://api.openai.com/v1", "gpt-4o"): (
            "%lm connect --continue-final-message: OpenAI's API has no continue_final_message field (vLLM, SGLang "
            "and lmnb serve servers take it); leave it out, and generate at the start of assistant messages "
            "({assistant}{gen x}{/assistant})"),
        ("http://127.0.0.1:9/v1", "gpt-3.5-turbo-instruct"): (
            "%lm connect --continue-final-message: 'gpt-3.5-turbo-instruct' is used as a completion model, whose "
            "gens go anywhere in the text already; leave it out"),
    }
    for (url, model), message in cases.items():
        line = parse_backend_line("connect", [url, "--openai", model, "--api-key", "k", "--continue-final-message"])
        with pytest.raises(CellError) as e:
            commands.connect(line, session=None)  # (refused before the session is used)
        assert str(e.value) == message
