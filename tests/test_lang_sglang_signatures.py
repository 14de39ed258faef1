"""SGLang programs call the primitives positionally in SGLang's argument order
(sglang/lang/api.py); these check that lmnb reads each position as SGLang does."""

from __future__ import annotations

import lmnb as sgl

from helpers_lang import ScriptedBackend


def test_gen_int_and_gen_string_take_sglangs_positional_arguments():
    # SGLang: gen_int(name, max_tokens, n, stop, stop_token_ids, stop_regex, temperature, ...);
    # lmnb's gen_int took only the name positionally, so gen_int("x", 5) was a TypeError.
    node = sgl.gen_int("x", 5, None, "\n", None, None, 0.5)
    assert (node.name, node.params.max_new_tokens, node.params.stop, node.params.temperature) == ("x", 5, "\n", 0.5)
    assert node.params.dtype is int
    node = sgl.gen_string("y", 7)
    assert (node.name, node.params.max_new_tokens, node.params.dtype) == ("y", 7, str)

    backend = ScriptedBackend(reply=lambda prompt, params: "42")

    @sgl.function
    def prog(s):
        s += "n=" + sgl.gen_int("n", 3)

    state = prog.run(backend=backend)
    assert state["n"] == 42
    (_, (_, params)), = [c for c in backend.calls if c[0] == "generate"]
    assert params.max_new_tokens == 3


def test_gen_reads_positional_arguments_in_sglangs_order():
    # SGLang: gen(name, max_tokens, min_tokens, n, stop, stop_token_ids, stop_regex, temperature, ...,
    # return_text_in_logprobs, dtype, choices, choices_method, regex, json_schema). lmnb had
    # temperature 7th and seed between dtype and choices, so these positions meant other things.
    node = sgl.gen("x", 16, None, None, "\n", None, r"\d", 0.25)
    assert (node.params.max_new_tokens, node.params.stop, node.params.stop_regex, node.params.temperature) == (
        16, "\n", r"\d", 0.25)
    args = [None] * 18 + [["yes", "no"]]  # max_tokens .. dtype, then choices (the 19th after name)
    choice = sgl.gen("pick", *args)
    assert choice.choices == ["yes", "no"]


def test_get_meta_info_of_a_name_nothing_set_is_none_as_in_sglang():
    # SGLang's StreamExecutor.get_meta_info returns self.meta_info.get(name, None); lmnb raised
    # KeyError for a name no primitive set.
    backend = ScriptedBackend(reply=lambda prompt, params: "ok")

    @sgl.function
    def prog(s):
        s += "a" + sgl.gen("x", max_tokens=2)

    state = prog.run(backend=backend)
    assert state.get_meta_info("not_a_variable") is None
    assert state.get_meta_info("x")["finish_reason"] == {"type": "stop"}


def test_run_and_run_batch_take_stop_regex_as_a_default_for_every_gen():
    # SGLang's SglFunction.run/run_batch take stop_regex (between stop_token_ids and temperature)
    # as a default sampling parameter; lmnb passed it on as a program argument (TypeError).
    backend = ScriptedBackend(reply=lambda prompt, params: "ok")

    @sgl.function
    def prog(s):
        s += "a" + sgl.gen("x", max_tokens=2) + sgl.gen("y", max_tokens=2, stop_regex=r"z+")

    prog.run(backend=backend, stop_regex=r"\d+")
    prog.run_batch([{}], backend=backend, stop_regex=[r"q"])
    sent = [params.stop_regex for kind, (_, params) in backend.calls if kind == "generate"]
    assert sent == [r"\d+", r"z+", [r"q"], r"z+"]


class _Index:
    """An integer type that is not int, as NumPy's np.int64 is (it has __index__)."""

    def __init__(self, n):
        self.n = n

    def __index__(self):
        return self.n


def test_fork_takes_any_integer_type_as_sglang_does():
    # SGLang's fork does size = int(size), so s.fork(np.int64(2)) forks 2; lmnb refused any
    # non-int. Bools, floats and strings stay refused.
    import pytest

    backend = ScriptedBackend(reply=lambda prompt, params: "ok")

    @sgl.function
    def prog(s, k):
        forks = s.fork(k)
        forks += sgl.gen("y", max_tokens=2)
        forks.join()

    assert prog.run(k=_Index(3), backend=backend)["y"] == ["ok", "ok", "ok"]
    for bad in (True, 2.0, "2", _Index(0)):
        with pytest.raises(ValueError, match="fork size must be an integer"):
            prog.run(k=bad, backend=backend)


def test_an_openai_timeout_of_parts_is_checked_part_by_part_and_a_tuple_is_refused_with_the_fix():
    """A tuple passed lmnb.OpenAI's checks unchecked, its numbers' meaning unsaid (httpx reads
    (connect, read, write, pool), requests (connect, read)); an httpx.Timeout of -1, NaN or 1e300
    too, failing every request. Each part is checked as a timeout in seconds is; inf is no limit."""
    import math
    import threading

    import httpx
    import openai
    import pytest

    made = sgl.OpenAI("m", api_key="k", base_url="http://127.0.0.1:9/v1", timeout=httpx.Timeout(5.0, read=math.inf))
    assert made.client.timeout == openai.Timeout(connect=5.0, read=None, write=5.0, pool=5.0)
    assert made._read_timeout() is None
    made = sgl.OpenAI("m", api_key="k", base_url="http://127.0.0.1:9/v1", timeout=openai.Timeout(None, connect=2))
    assert made.client.timeout == openai.Timeout(connect=2, read=None, write=None, pool=None)
    expected = "a positive number of seconds, or None for no limit"
    for bad, kind, said in (
            ((1, 2, 3, 4), TypeError, "lmnb.OpenAI timeout must be a positive number of seconds (or an httpx.Timeout), or "
             "None for no limit; got (1, 2, 3, 4) (tuple); a tuple does not say which wait each number is: give "
             "httpx.Timeout(SECONDS, connect=SECONDS), or name each of connect, read, write and pool"),
            ([1, 2], TypeError, "lmnb.OpenAI timeout must be a positive number of seconds (or an httpx.Timeout), or "
             "None for no limit; got [1, 2] (list); a list does not say which wait each number is: give "
             "httpx.Timeout(SECONDS, connect=SECONDS), or name each of connect, read, write and pool"),
            ({"read": 5}, TypeError, "lmnb.OpenAI timeout must be a positive number of seconds (or an httpx.Timeout), "
             "or None for no limit; got {'read': 5} (dict)"),
            (httpx.Timeout(-1), ValueError, f"lmnb.OpenAI timeout.connect=-1: give {expected}"),
            (httpx.Timeout(5, read=float("nan")), ValueError, f"lmnb.OpenAI timeout.read=nan: give {expected}"),
            (httpx.Timeout(5, pool="5"), TypeError, f"lmnb.OpenAI timeout.pool must be {expected}; got '5' (str)"),
            (httpx.Timeout(1e300), ValueError, "lmnb.OpenAI timeout.connect=1e+300 is longer than this platform's waits "
             f"take (at most {threading.TIMEOUT_MAX:.0f} s, threading.TIMEOUT_MAX): give at most that, or None (or "
             "math.inf) for no limit")):
        with pytest.raises(kind) as e:
            sgl.OpenAI("m", api_key="k", base_url="http://127.0.0.1:9/v1", timeout=bad)
        assert str(e.value) == said


def test_an_openai_base_url_given_as_an_httpx_url_reaches_the_client():
    """lmnb.OpenAI's check lets an httpx.URL through, which openai 3's client (on httpx2) refused
    in its own words ("Expected str or httpx2.URL"), with a finalizer's traceback: it goes as its text."""
    import httpx

    made = sgl.OpenAI("m", api_key="k", base_url=httpx.URL("http://127.0.0.1:9/v1"))
    assert str(made.client.base_url) == "http://127.0.0.1:9/v1/"


def test_openai_backend_takes_sglangs_positional_order():
    # SGLang: OpenAI(model_name, is_chat_model=None, chat_template=None, is_azure=False, *args, **kwargs)
    # with base_url/api_key going to the openai client as keywords. lmnb had base_url second, so
    # OpenAI("gpt-3.5-turbo-instruct", False) handed base_url=False to the client.
    chat_template = sgl.get_chat_template("chatml")
    backend = sgl.OpenAI("my-model", False, chat_template, api_key="k", base_url="http://127.0.0.1:9/v1")
    assert backend.is_chat_model is False
    assert backend.get_chat_template() is chat_template
    assert str(backend.client.base_url) == "http://127.0.0.1:9/v1/"


def test_lmnb_has_a_version_as_sglang_does():
    # SGLang exports sgl.__version__ (in its __all__); lmnb had none, an AttributeError.
    import pathlib
    import re

    pyproject = (pathlib.Path(__file__).resolve().parent.parent / "pyproject.toml").read_text()
    assert sgl.__version__ == re.search(r'^version = "([^"]+)"', pyproject, re.M).group(1)
    assert "__version__" in sgl.__all__


def test_global_config_default_backend_reads_and_sets_the_default_backend():
    # SGLang programs read sgl.global_config.default_backend (None until one is set) and assign it;
    # lmnb refused global_config altogether.
    import pytest

    import lmnb.api

    previous = lmnb.api._default_backend
    first, second = ScriptedBackend(), ScriptedBackend(reply=lambda prompt, params: "from second")
    try:
        sgl.set_default_backend(None)
        assert sgl.global_config.default_backend is None
        sgl.set_default_backend(first)
        assert sgl.global_config.default_backend is first
        sgl.global_config.default_backend = second
        assert sgl.get_default_backend() is second

        @sgl.function
        def prog(s):
            s += "a" + sgl.gen("x", max_tokens=2)

        assert prog.run()["x"] == "from second" and first.calls == []
        with pytest.raises(TypeError, match="is not a backend object"):
            sgl.global_config.default_backend = "http://localhost:30000"
    finally:
        lmnb.api._default_backend = previous


def test_global_configs_other_sglang_settings_say_what_lmnb_does_instead():
    import pytest

    with pytest.raises(AttributeError, match=r"has only default_backend, not 'verbosity': .*print\(state.text\(\)\)"):
        sgl.global_config.verbosity
    with pytest.raises(AttributeError, match=r"not 'enable_precache_with_tracing': run_batch always prefills"):
        sgl.global_config.enable_precache_with_tracing = False
    with pytest.raises(AttributeError, match=r"not 'default_init_new_token_ratio': engine settings are lmnb.Engine"):
        sgl.global_config.default_init_new_token_ratio = 0.5


def test_a_backend_argument_of_the_wrong_type_names_the_argument_what_was_given_and_what_is_expected():
    """lmnb.OpenAI(5) failed as "'int' object has no attribute 'lower'", run(backend=5) as "'int'
    object has no attribute 'get_chat_template'", RuntimeEndpoint(URL, timeout="x") on a bare '>'
    comparison; OpenAI's base_url and timeout in the openai client's words (its internals' traceback),
    chat_template_name=5 in the closest-name search, lmnb.Engine(engine=5) at the first program. Each
    is refused where it is given, naming the argument, the value and its type, and what it takes."""
    import pytest

    @sgl.function
    def prog(s):
        s += "a"

    backend = ("backend= must be a backend object (lmnb.Engine(), lmnb.RuntimeEndpoint(URL), lmnb.OpenAI(model), "
               "or None for the default); got 5 (int)")
    timeout = "timeout must be a positive number of seconds{}, or None for no limit; got 'x' (str)"
    cases = [
        (lambda: sgl.OpenAI(5, api_key="k"), "lmnb.OpenAI model_name must be a string, the API's model name (e.g. "
         "'gpt-4o-mini'); got 5 (int)"),
        (lambda: sgl.OpenAI("m", base_url=5, api_key="k"), "lmnb.OpenAI base_url must be a string, the API's URL "
         "(e.g. 'http://127.0.0.1:30000/v1'), or None for OpenAI's; got 5 (int)"),
        (lambda: sgl.OpenAI("m", api_key="k", timeout="x"), "lmnb.OpenAI " + timeout.format(" (or an httpx.Timeout)")),
        (lambda: sgl.OpenAI("m", "no", api_key="k"), "lmnb.OpenAI is_chat_model must be True, False, or None to "
         "tell by the model name; got 'no' (str)"),
        (lambda: sgl.OpenAI("m", api_key="k", chat_template="chatml"), "lmnb.OpenAI chat_template must be a "
         "ChatTemplate (e.g. lmnb.get_chat_template('chatml')), or None to choose one by the model name; got "
         "'chatml' (str)"),
        (lambda: sgl.RuntimeEndpoint("http://127.0.0.1:9", timeout="x"), "RuntimeEndpoint " + timeout.format("")),
        (lambda: sgl.RuntimeEndpoint("http://127.0.0.1:9", timeout=True),
         "RuntimeEndpoint timeout must be a positive number of seconds, or None for no limit; got True (bool)"),
        (lambda: sgl.RuntimeEndpoint("http://127.0.0.1:9", chat_template_name=5),
         f"a chat template name must be a string, one of {sorted(sgl.chat_template._REGISTRY)}; got 5 (int)"),
        (lambda: sgl.Engine(engine=5), "lmnb.Engine engine= must be an lmnb_engine.Engine (the in-process runtime, "
         "lmnb_engine.Engine(model=...)), or None to start one; got 5 (int)"),
        (lambda: prog.run(backend=5), backend),
        (lambda: prog.run_batch([{}], backend=5), backend),
        (lambda: prog.cache(backend=5), backend),
        (lambda: sgl.flush_cache(5), backend),
        (lambda: sgl.set_default_backend(5), backend),
    ]
    for call, said in cases:
        with pytest.raises(TypeError) as e:
            call()
        assert str(e.value) == said


def test_an_openai_base_url_that_is_no_http_url_of_the_api_is_refused_naming_one_to_give():
    """lmnb.OpenAI(base_url="127.0.0.1:30000/v1") failed each gen as "APIConnectionError: Connection
    error. (UnsupportedProtocol: ...)", a query had the routes put after it, and base_url="" went to
    OpenAI's own API (the client reads "" as none) to fail for its key. Each is refused as made,
    with the URL to give (as RuntimeEndpoint refuses its own); the /v1 URL a route's URL points
    into, as the 404 hint gives it, is worked by hand."""
    import pytest

    cases = [
        ("127.0.0.1:30000/v1", "the API's http(s) URL, e.g. 'http://127.0.0.1:30000/v1', or None for OpenAI's; got "
                               "'127.0.0.1:30000/v1'"),
        ("", "the API's http(s) URL, e.g. 'http://HOST:PORT/v1', or None for OpenAI's; got ''"),
        ("ftp://h:1/v1", "the API's http(s) URL, e.g. 'http://HOST:PORT/v1', or None for OpenAI's; got 'ftp://h:1/v1'"),
        ("http://h:1/v1?x=1", "the API's URL without a query or fragment, e.g. 'http://h:1/v1'; got "
                              "'http://h:1/v1?x=1'"),
        ("https://h/v1/chat/completions#a", "the API's URL without a query or fragment, e.g. 'https://h/v1'; got "
                                            "'https://h/v1/chat/completions#a'"),
    ]
    for url, said in cases:
        with pytest.raises(ValueError) as e:
            sgl.OpenAI("m", base_url=url, api_key="k")
        assert str(e.value) == "lmnb.OpenAI base_url must be " + said
    # the 404 hint's URL: it appended /v1 to a route's URL under /v1 (".../v1/chat/completions/v1")
    from lmnb.backend.openai import _api_root

    assert _api_root("http://h:1/v1/chat/completions") == "http://h:1/v1"
    assert _api_root("http://h:1/v1/completions/") == "http://h:1/v1"
    assert _api_root("http://h:1") == "http://h:1/v1"
    assert _api_root("http://h:1/proxy/") == "http://h:1/proxy/v1"
