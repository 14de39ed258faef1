"""The public primitives: ``@function``, ``gen``, ``select``, roles, ``image``/``video`` and the
default backend. Names, arguments and defaults are SGLang's (``python/sglang/lang/api.py`` and
``SglFunction`` in ``lang/ir.py``), so ``import lmnb as sgl`` runs SGLang programs unchanged.
"""

from __future__ import annotations

import collections.abc
import functools
import inspect
import operator
import sys
import threading
from typing import Any, Callable, Optional, Union

from lmnb.choices import (
    ChoicesSamplingMethod,
    choice_list,
    choices_method_problem,
    choices_problem,
    select_temperature_problem,
    token_length_normalized,
)
from lmnb.ir import (
    DEFAULT_MAX_NEW_TOKENS,
    OUTPUT_OPTIONS,
    RUN_MAX_TOKENS_OPTION,
    ExprList,
    Gen,
    GenParams,
    Image,
    RoleBegin,
    RoleEnd,
    RunDefaults,
    Select,
    Video,
    _python_value,
    as_expr,
    blank_name,
    check_flag,
    check_regex,
    check_stop_regex,
    check_text,
    did_you_mean,
    dtype_regex,
    json_schema_value,
    offering_keywords,
    output_clash,
    token_bounds_problem,
    unexpected_keyword,
    unexpected_keywords,
    shown_value,
)

_default_backend = None
_default_lock = threading.Lock()
_unset_default = None  # a host's factory for an unset default (the lmnb kernel's: its session's engine)
# run() keywords that SGLang's run() does not have, with their defaults. A program that declares
# an argument of one of these names (SGLang programs may: fork(n), a seed) gets the value instead.
_UNSET = object()
_LMNB_RUN_OPTIONS = {"n": 1, "seed": None, "use_thread": True, "state": None}


def _run_defaults(call: str, max_new_tokens: Optional[int], **params: Any) -> RunDefaults:
    """``run()``'s (``run_batch()``'s, ``call``: "run" or "run_batch") defaults for its gens:
    ``max_new_tokens`` None is lmnb's ``DEFAULT_MAX_NEW_TOKENS``; errors name one that was given as
    the option that gave it (``executor.max_tokens_option``: the Python API's
    ``run_batch(max_new_tokens=N)`` where ``call`` says so, a cell's)."""
    from lmnb.executor import current_max_tokens_option

    option = current_max_tokens_option()
    if option == RUN_MAX_TOKENS_OPTION:
        option = f"{call}(max_new_tokens={{}})"
    given = max_new_tokens is not None
    return RunDefaults(max_new_tokens=max_new_tokens if given else DEFAULT_MAX_NEW_TOKENS, **params,
                       max_tokens_option=option, max_tokens_given=given)


def _check_backend(backend: Any) -> None:
    """Refuse the non-backends easily given for one (None is "the default"): a server's URL, a
    backend class, the runtime's own ``lmnb_engine.Engine``, or anything else that has no backend's
    methods (an int); they failed deep in the run with an AttributeError.

    Raises:
        TypeError: naming the backend object to pass instead (and, for anything else, what was
            given and its type).
    """
    if isinstance(backend, (str, bytes)):
        raise TypeError(f"backend={backend!r} is not a backend object; pass lmnb.RuntimeEndpoint(URL) for an lmnb "
                        "or SGLang server, lmnb.OpenAI(model, base_url=URL) for an OpenAI-compatible API, or lmnb.Engine()")
    if isinstance(backend, type):
        raise TypeError(f"backend={backend.__name__} is a class; pass an instance of it ({backend.__name__}(...))")
    # (not imported, or still being imported on another thread: no runtime engine can have been made)
    runtime = getattr(sys.modules.get("lmnb_engine.engine"), "Engine", None)
    if runtime is not None and isinstance(backend, runtime):
        raise TypeError("backend= is an lmnb_engine.Engine, the inference runtime, not a language backend; wrap it: "
                        "lmnb.Engine(engine=that_engine)")
    from lmnb.backend.base import BaseBackend, given

    # (an int failed as "no attribute 'get_chat_template'"). A stand-in that hands its attributes on
    # (the kernel's SessionBackend, by __getattr__) is a backend too; its class is asked, not the
    # object, whose attributes would start the backend it stands for.
    if backend is not None and not isinstance(backend, BaseBackend) and not any(
            hasattr(type(backend), name) for name in ("get_chat_template", "__getattr__")):
        raise TypeError(f"backend= must be a backend object (lmnb.Engine(), lmnb.RuntimeEndpoint(URL), "
                        f"lmnb.OpenAI(model), or None for the default); got {given(backend)}")


def set_default_backend(backend) -> None:
    """Use ``backend`` (``Engine``, ``RuntimeEndpoint``, ``OpenAI``, ...) for programs run without
    ``backend=``; None unsets it, so the next such program uses the host's default again (in the
    lmnb kernel its engine, elsewhere the built-in demo ``Engine``: ``get_default_backend``). A
    default that has an ``on_replaced(new)`` method (looked up on its class: the lmnb kernel's,
    which warns that Python programs leave the engine its cells use) is told when another backend
    takes its place."""
    global _default_backend
    _check_backend(backend)
    previous, _default_backend = _default_backend, backend
    on_replaced = getattr(type(previous), "on_replaced", None)
    if on_replaced is not None and backend is not None and backend is not previous:
        on_replaced(previous, backend)


def get_default_backend():
    """The default backend; the first call without one set takes the host's (``set_unset_default``:
    the lmnb kernel's engine) or, with no host, starts an in-process ``Engine`` on the built-in demo
    model."""
    global _default_backend
    with _default_lock:
        if _default_backend is None:
            if _unset_default is not None:
                _default_backend = _unset_default()
            else:
                from lmnb.backend.engine import Engine

                _default_backend = Engine()
        return _default_backend


def set_unset_default(factory) -> None:
    """For a host of lmnb programs (the lmnb kernel): ``factory()`` is the backend an unset default
    becomes at its next use (after ``set_default_backend(None)``); None goes back to the demo
    ``Engine``."""
    global _unset_default
    _unset_default = factory


# SGLang's GlobalConfig settings a program may touch -> what lmnb does instead.
_GLOBAL_CONFIG_HINTS = {
    "verbosity": "lmnb prints nothing after a run; print(state.text()), or watch runs with lmnb.observe(callback)",
    "enable_precache_with_tracing": "run_batch always prefills the program's constant prefix first, and "
                                    "program.cache() does it on demand",
    "enable_parallel_encoding": "join('concate_and_append') appends the branches' text, which the next gen "
                                "prefills",
}


class GlobalConfig:
    """``sgl.global_config``, SGLang's settings object, with the one setting lmnb has:
    ``default_backend`` reads the backend ``set_default_backend`` set (None before one is set or
    started, as in SGLang), and assigning it is ``set_default_backend``. SGLang's other settings
    (``verbosity``, ``enable_precache_with_tracing``, ``enable_parallel_encoding``, the server's
    runtime constants) raise an ``AttributeError`` naming what lmnb does instead."""

    @property
    def default_backend(self):
        return _default_backend

    @default_backend.setter
    def default_backend(self, backend) -> None:
        set_default_backend(backend)

    def __getattr__(self, name: str):
        raise AttributeError(self._refusal(name))

    def __setattr__(self, name: str, value: Any) -> None:
        if name != "default_backend":
            raise AttributeError(self._refusal(name))
        super().__setattr__(name, value)

    @staticmethod
    def _refusal(name: str) -> str:
        hint = _GLOBAL_CONFIG_HINTS.get(name, "engine settings are lmnb.Engine(...)'s arguments or lmnb serve's "
                                               "options, sampling defaults are run()'s")
        return f"lmnb's global_config has only default_backend, not {name!r}: {hint}"


global_config = GlobalConfig()


def flush_cache(backend=None, empty_cache: bool = True):
    """Drop the prefix cache of ``backend`` (default: the default backend). ``empty_cache`` is
    SGLang's (it also returns freed device memory to the driver there); lmnb accepts and ignores it:
    the KV pool stays allocated.

    Raises:
        TypeError: ``backend`` is a URL or a class, not a backend object."""
    _check_backend(backend)
    return (backend or get_default_backend()).flush_cache()


def get_server_info(backend=None) -> dict:
    """Model and server description of ``backend`` (default: the default backend).

    Raises:
        TypeError: ``backend`` is a URL or a class, not a backend object."""
    _check_backend(backend)
    return (backend or get_default_backend()).get_server_info()


def _refuse_shadowed_parameters(method: Callable, batch: bool = False) -> Callable:
    """``run``/``run_batch`` refusing an option given by name that is also a parameter of the
    program which gets no value otherwise (``def f(s, q, stop=".")``; ``f.run(q="x", stop="!")``):
    the option would take the value and the parameter keep its default, silently. A parameter
    given a value positionally, by ``bind``, or (``run_batch``) by every item takes that value,
    and the option is the option, as under SGLang. A wrapper checks, because the method itself
    cannot tell an option given from one left at its default. ``run``'s ``n``, ``seed``,
    ``use_thread`` and ``state`` are no such options: they go to a program declaring them. With
    ``batch`` (wrapping ``run_batch``), every option of it is checked, ``n``, ``seed`` and its own
    ``num_threads``, ``progress_bar`` and ``generator_style`` too: run_batch gives none of them
    to the program, so each item must; and a keyword ``run_batch`` has no option for is refused
    naming the program's arguments (``_refuse_unknown_batch_keywords``)."""
    def names(m: Callable) -> frozenset:
        return frozenset(inspect.signature(m).parameters) - {"self", "args", "kwargs", "batch_kwargs"}

    options = names(method) if batch else names(method) - set(_LMNB_RUN_OPTIONS)

    @functools.wraps(method)  # (inspect.signature and help() still show the method's own options)
    def checked(self, *args, **kwargs):
        __tracebackhide__ = True  # see lmnb.interpreter._run_body
        if batch:
            _refuse_unknown_batch_keywords(self, kwargs, options)
        given = [k for k in kwargs if k in options and k in self.arg_names and k not in self.bind_arguments]
        positional = [p.name for p in list(self.signature.parameters.values())[1:]
                      if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        if not batch:  # the parameters run's positional values fill
            fills = [set(positional[: len(args)])]
        else:  # each item's (an item that is neither a dict nor a tuple is run_batch's own error)
            batch_kwargs = args[0] if args else kwargs.get("batch_kwargs")
            items = batch_kwargs if isinstance(batch_kwargs, (list, tuple)) else []
            fills = [set(x) if isinstance(x, dict) else set(positional[: len(x)]) for x in items
                     if isinstance(x, (dict, list, tuple))]
        unfilled = {k: next(i for i, f in enumerate(fills) if k not in f) for k in given
                    if any(k not in f for f in fills)}
        if unfilled:
            shadowed, caller = list(unfilled), method.__name__
            k = shadowed[0]
            named = (f"a parameter {k!r}, which is also the name of a {caller}() option" if len(shadowed) == 1 else
                     f"parameters {', '.join(map(repr, shadowed))}, which are also names of {caller}() options")
            which = f" (item {unfilled[k]} gives it none)" if batch else ""
            raise TypeError(f"program {self.__name__!r} has {named}: {caller}({k}=...) sets the option, and the "
                            f"program's {k!r} would not get the value{which}; rename the program's parameter (e.g. to "
                            f"{k + '_'!r}) and pass the value under that name")
        return method(self, *args, **kwargs)

    return checked


def _gen_options(unknown: list[str], call: str) -> tuple[list[str], str]:
    """The keywords of ``unknown`` (given to ``call``, ``run`` or ``run_batch``) that are not gen
    options of ``call`` but options of ``gen()`` alone (``logit_bias``, ``min_tokens``, ``regex``,
    ``json_schema``, ``dtype``, ...; SGLang's run takes none of them either), and the end of the
    refusal that says so: "did you mean" offered ``max_new_tokens`` for ``min_tokens`` and
    ``stop_regex`` for ``regex``, and nothing for ``logit_bias``. ``max_tokens`` is left to that
    offer (``max_new_tokens`` is the one meant). Returns (the other keywords, the ending)."""
    own = set(inspect.signature(gen).parameters) - {"name", "max_tokens"} - _RUN_KEYWORDS
    found = [k for k in unknown if k in own]
    if not found:
        return unknown, ""
    named = " and ".join(", ".join(found).rsplit(", ", 1))
    one = len(found) == 1
    return [k for k in unknown if k not in own], (
        f"; {named} {'is an option' if one else 'are options'} of gen(), not of {call}(): give "
        f"{'it' if one else 'them'} to the gens that use {'it' if one else 'them'}, gen(..., {found[0]}=...)")


def _refuse_unknown_batch_keywords(program: "SglFunction", kwargs: dict, options: frozenset) -> None:
    """Refuse a keyword ``run_batch`` has no option for in words that name the program's
    arguments, as ``run`` does (``program 'f': got an unexpected keyword argument ...; its
    arguments are [...]``), where Python's own ``TypeError`` named only ``run_batch``: its items,
    not its keywords, give the program's arguments, which a keyword naming one is told, with
    ``bind`` for one value shared by every item; a keyword close to an option is offered it.

    Raises:
        TypeError: a keyword that is neither ``batch_kwargs`` nor one of ``options``."""
    unknown = [k for k in kwargs if k not in options and k != "batch_kwargs"]
    if not unknown:
        return
    k, name = unknown[0], program.__name__
    takes_any = any(p.kind is p.VAR_KEYWORD for p in program.signature.parameters.values())
    if k in program.arg_names or takes_any:
        bound = f", or give every item the one value with {name}.bind({k}=...).run_batch(...)" if (
            k in program.arg_names) else ""  # (bind takes only declared arguments)
        raise TypeError(f"program {name!r}: run_batch() got its argument {k!r} by keyword; each item of batch_kwargs "
                        f"gives the program's arguments: put {k!r} in every item ({{{k!r}: ...}}){bound}")
    rest, gens = _gen_options(unknown, "run_batch")
    meant = did_you_mean(rest, ("the run_batch option ", options)) + gens
    raise TypeError(f"program {name!r}: run_batch() got {unexpected_keywords(unknown)}; its arguments are "
                    f"{program.arg_names}, given by each item of batch_kwargs{meant}")


class SglFunction:
    """An LM program: a Python function whose first parameter is the program state.

    Call ``run`` (or the object itself) for one execution, ``run_batch`` for many.
    """

    def __init__(self, func: Callable, num_api_spec_tokens: Optional[int] = None, bind_arguments: Optional[dict] = None):
        params = list(inspect.signature(func).parameters.values())
        if not params or params[0].kind not in (params[0].POSITIONAL_ONLY, params[0].POSITIONAL_OR_KEYWORD):
            raise TypeError(f"@function {func.__name__!r} must take the program state as its first parameter (s)")
        kind = ("an async def" if inspect.iscoroutinefunction(func) or inspect.isasyncgenfunction(func) else
                "a generator (it yields)" if inspect.isgeneratorfunction(func) else None)
        if kind:  # (calling it only made a coroutine or generator: the program ran nothing, silently)
            raise TypeError(f"@function {func.__name__!r} is {kind}; a program body is a plain def with no await or "
                            "yield (the interpreter runs it on a thread; its gens run concurrently already)")
        if num_api_spec_tokens is not None and (not isinstance(num_api_spec_tokens, int) or num_api_spec_tokens < 1):
            raise ValueError(f"num_api_spec_tokens must be a positive integer, got {shown_value(num_api_spec_tokens)}")
        self.func = func
        self.num_api_spec_tokens = num_api_spec_tokens
        self.bind_arguments = dict(bind_arguments or {})
        self.signature = inspect.signature(func)
        self.arg_names = [p.name for p in params[1:]]
        self.__name__ = getattr(func, "__name__", "program")
        self.__doc__ = func.__doc__

    def bind(self, **kwargs) -> "SglFunction":
        """A copy with some arguments fixed (they count as constant text for prefix hints).

        Raises:
            TypeError: a name that is not an argument of the program.
        """
        unknown = [k for k in kwargs if k not in self.arg_names]
        if unknown:
            raise TypeError(f"program {self.__name__!r} has no argument(s) {unknown}; it has {self.arg_names}"
                            + did_you_mean(unknown, ("", self.arg_names)))
        return SglFunction(self.func, self.num_api_spec_tokens, {**self.bind_arguments, **kwargs})

    def _check_args(self, args: tuple, kwargs: dict, options: frozenset = frozenset()) -> None:
        """Refuse ``args`` and ``kwargs`` that do not fit the program's signature; an unexpected
        keyword close to an argument's name, or else to one of ``options`` (``run()``'s), is offered it.

        Raises:
            TypeError: naming the program, the problem and its arguments."""
        state = next(iter(self.signature.parameters), None)
        if state in kwargs:  # (bind's words, "multiple values for argument 's'", then also call it unexpected)
            raise TypeError(f"program {self.__name__!r}: {state}= is the program's state, its first parameter, "
                            f"which run() passes itself; leave it out (its arguments are {self.arg_names})")
        try:
            self.signature.bind(None, *args, **{**self.bind_arguments, **kwargs})
        except TypeError as e:
            params = self.signature.parameters.values()
            unknown = [] if any(p.kind is p.VAR_KEYWORD for p in params) else [
                k for k in kwargs if k not in self.arg_names]
            if unknown and "unexpected keyword" in str(e):  # (bind names only the first of them)
                e = f"got {unexpected_keywords(unknown)}"
            elif unknown:  # (bind names only the first problem it meets)
                e = f"{e}; {unexpected_keywords(unknown).removeprefix('an ')}"
            # a misspelt argument, or else a misspelt run() option, or one of gen()'s alone
            rest, gens = _gen_options(unknown, "run") if options else (unknown, "")
            meant = did_you_mean(rest, ("", self.arg_names), ("the run option ", options)) + gens
            raise TypeError(f"program {self.__name__!r}: {e}; its arguments are {self.arg_names}{meant}") from None

    @_refuse_shadowed_parameters
    def run(
        self,
        *args,
        max_new_tokens: Optional[int] = None,  # DEFAULT_MAX_NEW_TOKENS
        n: int = _UNSET,  # 1
        stop: Optional[Union[str, list[str]]] = None,
        stop_token_ids: Optional[list[int]] = None,
        stop_regex: Optional[Union[str, list[str]]] = None,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = -1,
        min_p: float = 0.0,
        frequency_penalty: float = 0.0,
        presence_penalty: float = 0.0,
        ignore_eos: bool = False,
        seed: Optional[int] = _UNSET,  # None
        return_logprob: Optional[bool] = None,
        logprob_start_len: Optional[int] = None,
        top_logprobs_num: Optional[int] = None,
        return_text_in_logprobs: Optional[bool] = None,
        stream: bool = False,
        backend=None,
        use_thread: bool = _UNSET,  # True
        state=_UNSET,  # None
        **kwargs,
    ):
        """Run the program once; the sampling arguments are defaults for every ``gen`` in it
        (SGLang's: ``temperature=1.0`` samples unless a gen says otherwise; ``stop_regex`` applies to
        every gen that gives none; ``seed`` is an lmnb extension). ``max_new_tokens`` None (the
        default) is lmnb's 128 (``DEFAULT_MAX_NEW_TOKENS``); where a gen that took the run's number
        does not fit the model, its error says whether it was that default or ``run(max_new_tokens=N)``.

        Returns the ``ProgramState`` when done, or at once with ``stream=True`` (read it with
        ``text_iter``). Errors of primitives surface when the state is read; so does that of a
        fork branch never joined whose error the program did not read (``UnjoinedForkError``,
        once the body returned and such branches ran). ``state`` (an lmnb
        extension) continues an existing ``ProgramState`` — its text, messages, variables and
        backend — instead of starting empty. A state that failed (or was aborted) is continued too,
        and its error is forgotten: the new body goes on from the text as it was when the error
        happened (without the failed primitive's output and the primitives skipped after it),
        ``error()`` then tells only of the new run, and a variable the failed primitive was to set
        is missing (``KeyError``) instead of raising the error. So a state whose failure was
        passing (a backend that was down) can be carried on; check ``state.error()`` before
        continuing one whose earlier output matters. ``n``,
        ``seed``, ``use_thread`` and ``state``, which SGLang's ``run`` lacks, are the program's own
        arguments where it declares one of those names (``def tips(s, n)``), as under SGLang.

        Raises:
            TypeError: arguments that do not fit the program's signature; an option given by name that
                is also a parameter of the program (``stop=`` to ``def f(s, stop=".")``: rename the
                parameter); a ``backend`` that is a URL or a class, not a backend object; a ``state``
                that is not a ``ProgramState``; a flag (``stream``, ``return_logprob``, ``ignore_eos``, ...)
                that is not True or False; a ``max_new_tokens`` that is not an integer.
            ValueError: ``max_new_tokens`` below 0.
            RuntimeError: with ``stream=True``, no thread could be started for the body (a
                continued ``state`` is left as it was, usable).
            KeyboardInterrupt: Ctrl-C (a notebook's stop button) while it ran: its requests were
                aborted first, and the message says so and where the text went (a continued
                ``state`` keeps it in ``state.error().partial_text``).
        """
        __tracebackhide__ = True  # see lmnb.interpreter._run_body
        from lmnb.executor import max_tokens_option
        from lmnb.interpreter import run_program
        from lmnb.tracer import stop_if_tracing

        stop_if_tracing()  # a program run inside one traced for its prefix (run_batch) ends the trace
        _check_backend(backend)
        options = {"n": n, "seed": seed, "use_thread": use_thread, "state": state}
        for name, value in options.items():
            if value is not _UNSET and name in self.arg_names:
                kwargs[name] = value
                options[name] = _UNSET
        n, seed, use_thread, state = (_LMNB_RUN_OPTIONS[k] if v is _UNSET else v for k, v in options.items())
        stream = check_flag("stream", stream)
        use_thread = check_flag("use_thread", use_thread)
        self._check_args(args, kwargs, _RUN_KEYWORDS)
        check_stop_regex(stop_regex)
        defaults = _run_defaults(
            "run", max_new_tokens, n=n, stop=stop, stop_token_ids=stop_token_ids, stop_regex=stop_regex,
            temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p,
            frequency_penalty=frequency_penalty, presence_penalty=presence_penalty,
            ignore_eos=ignore_eos, seed=seed, return_logprob=return_logprob, logprob_start_len=logprob_start_len,
            top_logprobs_num=top_logprobs_num, return_text_in_logprobs=return_text_in_logprobs,
        )
        if state is not None:
            from lmnb.interpreter import ProgramState

            if not isinstance(state, ProgramState):  # (it failed as "'str' object has no attribute ...")
                raise TypeError(f"run(state=...) continues a ProgramState (what run() returned), not a "
                                f"{type(state).__name__}")
            backend = backend or state.stream_executor.backend
            if backend is not state.stream_executor.backend:
                raise ValueError("run(state=...) continues a state on its own backend; do not pass another")
        with max_tokens_option(RUN_MAX_TOKENS_OPTION):  # the body's own run() calls are the Python API's
            return run_program(
                self, backend or get_default_backend(), args, kwargs, defaults, stream, use_thread, state=state
            )

    @functools.partial(_refuse_shadowed_parameters, batch=True)
    def run_batch(
        self,
        batch_kwargs,
        *,
        max_new_tokens: Optional[int] = None,  # DEFAULT_MAX_NEW_TOKENS
        n: int = 1,
        stop: Optional[Union[str, list[str]]] = None,
        stop_token_ids: Optional[list[int]] = None,
        stop_regex: Optional[Union[str, list[str]]] = None,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = -1,
        min_p: float = 0.0,
        frequency_penalty: float = 0.0,
        presence_penalty: float = 0.0,
        ignore_eos: bool = False,
        seed: Optional[int] = None,
        return_logprob: Optional[bool] = None,
        logprob_start_len: Optional[int] = None,
        top_logprobs_num: Optional[int] = None,
        return_text_in_logprobs: Optional[bool] = None,
        backend=None,
        num_threads: Union[str, int] = "auto",
        progress_bar: bool = False,
        generator_style: bool = False,
    ):
        """Run the program once per item of ``batch_kwargs`` (dicts of arguments, or tuples
        mapped onto the arguments in order) on ``num_threads`` threads; returns the states in
        order (a generator with ``generator_style``). A failing item does not stop the others.
        The sampling arguments are ``run``'s (``max_new_tokens`` None is lmnb's 128), but for ``seed``:
        item i runs with ``lmnb.executor.derived_seed(seed, (i,))``, as a fork branch derives its
        own, so identical items are distinct samples, reproducibly.
        Keyword-only arguments (after ``*`` in the program's signature) are filled by a dict item,
        by name; a tuple's values fill only the arguments before the ``*``.

        Raises:
            TypeError: an item that does not fit the program's signature (checked before any run; named
                by its index); a keyword that is none of these options (its message names the program's
                arguments, which the items give); an option given that is also a parameter of the
                program (``stop=`` to ``def f(s, stop=".")``: rename the parameter); a ``backend`` that is a URL or a class; a flag (``progress_bar``,
                ``return_logprob``, ``ignore_eos``, ...) that is not True or False; a ``max_new_tokens`` that
                is not an integer.
            ValueError: ``max_new_tokens`` below 0.
        """
        from lmnb.interpreter import run_program_batch
        from lmnb.tracer import stop_if_tracing

        stop_if_tracing()
        _check_backend(backend)
        progress_bar = check_flag("progress_bar", progress_bar)
        generator_style = check_flag("generator_style", generator_style)
        if not isinstance(batch_kwargs, (list, tuple)):
            raise TypeError(f"run_batch takes a list of argument dicts, not {type(batch_kwargs).__name__}"
                            + _batch_fix(batch_kwargs))
        items = []
        params = list(self.signature.parameters.values())[1:]
        only = [p.name for p in params if p.kind is p.POSITIONAL_ONLY]
        if only:  # (an item reaches the body as keyword arguments, as in SGLang)
            raise TypeError(f"program {self.__name__!r} has positional-only arguments {only} (before '/'), which "
                            "run_batch passes by name; drop the '/', or call run per item")
        positional = [p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD]  # what a tuple's values fill
        # keyword-only arguments (after '*') are given by name, as in a call: a dict item fills them, a tuple does not
        keyword_only = [p.name for p in params if p.kind is p.KEYWORD_ONLY]
        required = [p.name for p in params if p.kind is p.KEYWORD_ONLY and p.default is p.empty
                    and p.name not in self.bind_arguments]
        by_name = (f"; keyword-only arguments {keyword_only} (after '*') take no value from a tuple: give the item "
                   "as a dict of arguments by name" if keyword_only else "")
        for i, item in enumerate(batch_kwargs):
            from_tuple = isinstance(item, (list, tuple))
            if from_tuple:
                if len(item) > len(positional):
                    varargs = [f"*{p.name}" for p in params if p.kind is p.VAR_POSITIONAL]
                    extra = (f"; a batch item cannot fill {varargs[0]}: pass each item's arguments by name, or call "
                             "run per item" if varargs else by_name)
                    raise TypeError(f"run_batch item {i} has {len(item)} values for arguments {positional}{extra}")
                item = dict(zip(positional, item))
            if not isinstance(item, dict):
                raise TypeError(f"run_batch item {i} is {type(item).__name__} {shown_value(item):.40}, not a dict "
                                "or tuple")
            try:
                self._check_args((), item)
            except TypeError as e:
                hint = by_name if from_tuple and required else ""
                raise TypeError(f"run_batch item {i}: {e}{hint}") from None
            items.append(item)
        if not items:
            return []
        check_stop_regex(stop_regex)
        defaults = _run_defaults(
            "run_batch", max_new_tokens, n=n, stop=stop, stop_token_ids=stop_token_ids, stop_regex=stop_regex,
            temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p,
            frequency_penalty=frequency_penalty, presence_penalty=presence_penalty,
            ignore_eos=ignore_eos, seed=seed, return_logprob=return_logprob, logprob_start_len=logprob_start_len,
            top_logprobs_num=top_logprobs_num, return_text_in_logprobs=return_text_in_logprobs,
        )
        return run_program_batch(
            self, backend or get_default_backend(), items, defaults, num_threads, progress_bar, generator_style
        )

    def cache(self, backend=None) -> None:
        """Prefill the program's constant prefix (the text every run of it begins with, found by
        tracing, ``lmnb.tracer``) into the prefix cache of ``backend`` (default: the default
        backend), as ``run_batch`` does before a batch: SGLang's ``SglFunction.cache``. A program
        that begins with an argument's value or a gen has none, and nothing is prefilled.

        Raises:
            ValueError, BackendError: the backend refused the prefill (a prefix too long for the
                model), said of the prefix: ``cache() could not prefill the program's constant
                prefix: prefix of N tokens exceeds the model's context length ...``; the backend's
                own words say "prompt", the prefill request's.
            KeyboardInterrupt: Ctrl-C while it prefilled: the prefill request was aborted, and the
                message says so.
        """
        import re

        from lmnb.backend.base import BackendError
        from lmnb.interpreter import prefill_prefix
        from lmnb.tracer import extract_prefix

        _check_backend(backend)
        backend = backend or get_default_backend()
        prefix = extract_prefix(self, backend.get_chat_template())
        if not prefix:
            return
        try:
            prefill_prefix(backend, prefix, "cache()")
        except (ValueError, BackendError) as e:
            if type(e) not in (ValueError, BackendError):  # (a subclass may take other arguments)
                raise
            said = re.sub(r"\bprompt\b", "prefix", str(e))
            raise type(e)(f"cache() could not prefill the program's constant prefix: {said}") from e

    def __call__(self, *args, **kwargs):
        __tracebackhide__ = True  # see lmnb.interpreter._run_body
        return self.run(*args, **kwargs)

    def __getattr__(self, name: str):
        # (only for names the instance lacks) SGLang's program-graph compiler: not in lmnb
        if name in ("trace", "compile"):
            raise AttributeError(f"lmnb programs have no {name}() (SGLang's tracer and graph compiler are not "
                                 "part of lmnb); call run() or run_batch(), and cache() to prefill the constant prefix")
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __repr__(self) -> str:
        return f"<lmnb program {self.__name__}>"


# run()'s own options, offered for a misspelt one (which run() takes as a program argument)
_RUN_KEYWORDS = frozenset(inspect.signature(SglFunction.run).parameters) - {"self", "args", "kwargs"}


def function(func: Optional[Callable] = None, num_api_spec_tokens: Optional[int] = None):
    """Decorator making ``func(s, ...)`` an LM program (``SglFunction``).

    ``num_api_spec_tokens``: API speculative execution (paper §2/§6) for API backends — one call
    generates this many tokens past the first ``gen`` and later ``gen``s are matched from it. On a
    chat model one call writes each assistant message, with its first gen's sampling parameters: a
    later gen of the role whose own differ is refused (a ``ValueError`` naming it, the option and the
    fix) before the call, as SGLang refuses it (docs/language.md, Backends: "API speculative execution").
    """
    if func is not None:
        return SglFunction(func, num_api_spec_tokens)

    def decorator(f: Callable) -> SglFunction:
        return SglFunction(f, num_api_spec_tokens)

    return decorator


@offering_keywords
def gen(
    name: Optional[str] = None,
    max_tokens: Optional[int] = None,
    min_tokens: Optional[int] = None,
    n: Optional[int] = None,
    stop: Optional[Union[str, list[str]]] = None,
    stop_token_ids: Optional[list[int]] = None,
    stop_regex: Optional[Union[str, list[str]]] = None,
    temperature: Optional[float] = None,
    top_p: Optional[float] = None,
    top_k: Optional[int] = None,
    min_p: Optional[float] = None,
    frequency_penalty: Optional[float] = None,
    presence_penalty: Optional[float] = None,
    ignore_eos: Optional[bool] = None,
    return_logprob: Optional[bool] = None,
    logprob_start_len: Optional[int] = None,
    top_logprobs_num: Optional[int] = None,
    return_text_in_logprobs: Optional[bool] = None,
    dtype: Optional[Any] = None,
    choices: Optional[list[str]] = None,
    choices_method: Optional[ChoicesSamplingMethod] = None,
    regex: Optional[str] = None,
    json_schema: Any = None,
    seed: Optional[int] = None,
    logit_bias: Optional[dict[int, float]] = None,
):
    """Generate text into variable ``name``. Arguments left None inherit the ``run`` defaults.

    The arguments are in SGLang's order (``sgl.gen("x", 16, None, None, "\\n")``), then lmnb's
    ``seed`` and ``logit_bias``.

    ``max_tokens``/``min_tokens`` count tokens. ``regex`` (compiled here first, so a bad pattern
    fails at once) and ``json_schema`` (JSON string, dict, or pydantic model class; a string or
    dict is checked here against the JSON Schema meta-schema, as the engine checks it, but for
    whether each ``pattern`` is a regex of the backend's dialect, which the backend checks) constrain the
    output and reach the backend unchanged (``True``, JSON Schema's any value, too); the output
    of a pydantic class is validated with it (the variable holds the text), since its validators
    are code no schema holds. ``seed`` (lmnb extension) makes a sampled gen
    reproducible. ``stop_regex`` (an lmnb extension: SGLang's server parameter) ends the output at
    the first match of a pattern or of any in a list, like a stop string (checked here; the
    official OpenAI API has none). Its ``$`` (outside ``(?m)``) and ``\\Z`` are the end of the
    whole output, not of the text so far nor of a line: such a stop never ends a gen sooner; where
    the output ends anyway (EOS, a stop token; not a max tokens cut, whose finish stays ``length``)
    it cuts a match ending there and makes the finish reason ``stop`` (docs/language.md, "stop_regex"). ``dtype`` (int, float, bool, str) constrains with a
    regex and stores the parsed value. With ``choices`` (strings: a list, or any iterable of them
    such as a numpy array or a pandas Series) this is ``select`` (SGLang: greedy, scored
    with ``choices_method``, default ``token_length_normalized``), one pick. Numbers may be numpy
    scalars and ``stop_token_ids`` a 1-D numpy array: each is read as the Python values it holds.
    ``logit_bias`` (OpenAI's API's and SGLang's server's; not in SGLang's ``gen``) maps token ids
    of the backend's model (``{1234: -100}``; their decimal text, ``{"1234": -100}``, too: no words,
    as the language has no backend-neutral encoder; ``lmnb.Engine(...).get_tokenizer().encode(word,
    add_special_tokens=False)`` in process, the model's ``transformers.AutoTokenizer`` for a served one) to a
    bias in [-100, 100] added to their logits at every token, before the greedy argmax or the
    temperature and top_k / top_p / min_p (-100 bans a token in effect, +100 forces it; a regex's or
    JSON schema's masked tokens stay masked): the in-process engine and an lmnb or SGLang server
    (``RuntimeEndpoint``, in ``sampling_params``) apply it, and ``OpenAI`` sends it as the API's
    ``logit_bias``. Logprobs asked for are the model's own, before the bias, on the engine and
    lmnb serve (OpenAI's API reports them after it).

    An argument's own problem is raised before a problem of two together, as a ``%%lm`` cell tells
    them (a dict as choices before ``max_tokens`` beside choices).

    Raises:
        ValueError: a number option out of SGLang's range (``temperature`` < 0, ``top_p`` outside
            (0, 1], ``n`` < 1 or above the engine's 128, ``min_tokens`` above ``max_tokens``, ...:
            ``lmnb.ir.option_problem``,
            the check a ``%%lm`` cell makes of a literal), an invalid regex, stop_regex, JSON schema
            or dtype, more than one of regex,
            json_schema, dtype and choices (each decides the output alone), ``n`` > 1 with
            choices, or with choices another option a pick cannot use (``max_tokens``, ``stop``,
            ``top_p``, ``seed``, ...: all but ``temperature`` and ``choices_method``), or choices
            that ``select`` refuses, a ``top_logprobs_num`` that is not an integer >= 0 (its upper
            bound is the backend's: the engine's is 20), a ``logit_bias`` key that is no token id
            or bias that is no number in [-100, 100] (the key named; ids past the model's
            vocabulary are the backend's to refuse).
        TypeError: ``name`` is not a string or None (an empty one is a ValueError); a ``choices_method`` other than None that is no
            ``ChoicesSamplingMethod``, with choices or without them; ``ignore_eos``,
            ``return_logprob`` or ``return_text_in_logprobs`` is not True, False or None; a ``logit_bias``
            that is no dict; a number option holds no
            int (``max_tokens``, ``n``, ``top_k``, ...) or no int or float (``temperature``, ...):
            every backend refuses it, a server's after it failed to encode the request as JSON.
    """
    _check_name("gen", name)
    # Each argument's own problems first (its type, its range, a regex that does not compile), then
    # the combinations, so that a value that cannot be (choices in a dict) is told before an option
    # that only goes with another (max_tokens beside choices): dropping the one leaves the other.
    pick = None
    if choices is not None:  # (select()'s checks of choices, the temperature and choices_method)
        pick = _select("gen(..., choices=...)", name, choices, 0.0 if temperature is None else temperature,
                       token_length_normalized if choices_method is None else choices_method)
    elif choices_method is not None:  # (no method is a bad value with or without choices: SGLang's gen drops it)
        problem = choices_method_problem(choices_method)
        if problem:
            raise TypeError(problem)
    check_regex(regex)
    check_stop_regex(stop_regex)
    if dtype is not None:
        dtype_regex(dtype)
    params = GenParams(
        max_new_tokens=max_tokens, min_new_tokens=min_tokens, n=n, stop=stop, stop_regex=stop_regex,
        stop_token_ids=stop_token_ids, top_p=top_p, top_k=top_k, min_p=min_p,
        frequency_penalty=frequency_penalty, presence_penalty=presence_penalty,
        temperature=None if pick is not None else temperature,  # (a pick's: select()'s rule, checked above)
        ignore_eos=ignore_eos, seed=seed, return_logprob=return_logprob, logprob_start_len=logprob_start_len,
        top_logprobs_num=top_logprobs_num, return_text_in_logprobs=return_text_in_logprobs,
        regex=regex, json_schema=json_schema_value(json_schema), dtype=dtype, logit_bias=logit_bias,
    )
    chosen = {"regex": regex, "json_schema": json_schema, "dtype": dtype, "choices": choices}
    clash = output_clash([k for k in OUTPUT_OPTIONS if chosen[k] is not None])
    if clash:
        raise ValueError(clash)
    if pick is not None:
        if n is not None and n != 1:  # (SGLang drops n here without a word: one variable, one pick)
            raise ValueError(f"gen(..., choices=...) picks one choice and takes no n (got n={n!r}); for several "
                             "picks, fork(n) and gen(..., choices=..., temperature=...) in each branch")
        # SGLang drops these too without a word; a pick generates nothing, so none of them can act
        unused = {"max_tokens": max_tokens, "min_tokens": min_tokens, "stop": stop, "stop_token_ids": stop_token_ids,
                  "stop_regex": stop_regex, "top_p": top_p, "top_k": top_k, "min_p": min_p,
                  "frequency_penalty": frequency_penalty, "presence_penalty": presence_penalty,
                  "ignore_eos": ignore_eos, "return_logprob": return_logprob, "logprob_start_len": logprob_start_len,
                  "top_logprobs_num": top_logprobs_num, "return_text_in_logprobs": return_text_in_logprobs,
                  "seed": seed, "logit_bias": logit_bias}
        given = [k for k, v in unused.items() if v is not None]
        if given:
            raise ValueError(f"gen(..., choices=...) scores the choices and generates nothing, so {', '.join(given)} "
                             "would do nothing; drop them (it takes name, temperature and choices_method; "
                             "run(seed=...) makes a sampled pick reproducible)")
        return pick
    problem = token_bounds_problem(params.max_new_tokens, params.min_new_tokens)
    if problem:
        raise ValueError(problem)
    return Gen(name, params, model=json_schema if isinstance(json_schema, type) else None)


def _check_name(primitive: str, name: Any) -> None:
    """A result name is a string (the variable's key) or None (unnamed). An empty or whitespace-only
    name is refused: SGLang stores the result under the key "" or " " without a check, which no
    program means (an f-string or a variable that came out blank), and a ``%%lm`` cell cannot name
    it (nor put it among the kernel's variables). Other strings are taken, as SGLang takes them."""
    if name is not None and not isinstance(name, str):
        raise TypeError(f"{primitive}() name must be a string (the variable to store the result in) or None, "
                        f"got {shown_value(name)}; the first positional argument is the name")
    if name is not None and not name.strip():
        raise ValueError(f"{primitive}() name is {blank_name(name, 'result')}; give the variable a name, e.g. "
                         f'{primitive}("answer", ...), or leave the name out ({primitive}(...) or name=None) to store '
                         "the result in no variable")


# SGLang's positional order for gen_int / gen_string: name, max_tokens, n, stop, stop_token_ids,
# stop_regex, temperature, ... (``sgl.gen_int("x", 8)`` means max_tokens=8 there too).
_TYPED_GEN_ARGS = (
    "max_tokens", "n", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p", "top_k", "min_p",
    "frequency_penalty", "presence_penalty", "ignore_eos", "return_logprob", "logprob_start_len",
    "top_logprobs_num", "return_text_in_logprobs",
)


# the keywords gen_int and gen_string pass on to gen (dtype is theirs to set)
_GEN_KEYWORDS = frozenset(inspect.signature(gen).parameters) - {"name", "dtype"}


def _typed_gen(caller: str, dtype: type, name: Any, args: tuple, kwargs: dict):
    """``gen(name, dtype=dtype, ...)`` with positional arguments read in SGLang's gen_int order.

    Raises:
        TypeError: too many positional arguments, or a keyword gen() has not (``unexpected_keyword``).
        ValueError: a name ``_check_name`` refuses, or another output option (regex, json_schema,
            choices) beside the ``dtype`` the caller sets."""
    if len(args) > len(_TYPED_GEN_ARGS):
        raise TypeError(f"{caller}() takes at most {len(_TYPED_GEN_ARGS) + 1} positional arguments")
    for key, value in zip(_TYPED_GEN_ARGS, args):
        if key in kwargs:
            raise TypeError(f"{caller}() got multiple values for argument {key!r}")
        kwargs[key] = value
    unexpected_keyword(caller, kwargs, _GEN_KEYWORDS)
    _check_name(caller, name)  # (named as the user called it, not as gen)
    given = [k for k in OUTPUT_OPTIONS if kwargs.get(k) is not None]
    if given:  # (gen()'s "takes one of dtype, choices ...; keep one" named a dtype the caller never wrote)
        raise ValueError(f"{caller}() is gen(dtype={dtype.__name__}), which takes no {given[0]} beside dtype: they "
                         f"each decide the output; call gen() with {given[0]} instead of {caller}()")
    return gen(name, dtype=dtype, **kwargs)


def gen_int(name: Optional[str] = None, *args, **kwargs):
    """``gen(name, dtype=int, ...)``: an integer (stored parsed as ``int``). Positional arguments
    after ``name`` follow SGLang's ``gen_int``: max_tokens, n, stop, stop_token_ids, stop_regex,
    temperature, top_p, top_k, min_p, frequency_penalty, presence_penalty, ignore_eos,
    return_logprob, logprob_start_len, top_logprobs_num, return_text_in_logprobs."""
    return _typed_gen("gen_int", int, name, args, kwargs)


def gen_string(name: Optional[str] = None, *args, **kwargs):
    """``gen(name, dtype=str, ...)``: words, digits and spaces in double quotes, a JSON string
    literal (SGLang's string regex; the variable keeps the quotes, as in SGLang). Positional
    arguments after ``name`` are those of ``gen_int``, in SGLang's order."""
    return _typed_gen("gen_string", str, name, args, kwargs)


@offering_keywords
def select(
    name: Optional[str] = None,
    choices: Optional[list[str]] = None,
    temperature: float = 0.0,
    choices_method: ChoicesSamplingMethod = token_length_normalized,
):
    """Append the choice the model finds most likely and store it in ``name``.

    ``choices``: strings, in a list or any other iterable (a tuple, a numpy array, a pandas Series;
    a set's are taken in sorted order), but a dict, which is refused: say ``list(d)`` for its keys
    or ``list(d.values())`` for its values.

    Scoring (``lmnb.choices``): each choice's tokens after the prompt, with token healing at the
    boundary, normalized by ``choices_method``. ``temperature`` > 0 samples from the softmax of
    the method's scores instead of taking the best.

    Raises:
        ValueError: choices missing, empty, not all non-empty strings, or listing one more than once
            (SGLang accepts repeats, but which entry was picked would be ambiguous); a temperature
            that is not a finite number >= 0; an empty ``name`` ("").
        TypeError: choices in a dict; a ``choices_method`` that is no ``ChoicesSamplingMethod``; a
            ``name`` that is no string or None.
    """
    _check_name("select", name)
    return _select("select()", name, choices, temperature, choices_method)


def _select(caller: str, name: Any, choices: Any, temperature: Any, choices_method: Any) -> Select:
    """``select``'s checks and node; errors name ``caller``, the form the user wrote. Choices are
    read by ``choice_list`` (a numpy array, a pandas Series, a generator, a set sorted), and a numpy
    temperature as the Python number it holds, as gen()'s other options are."""
    # (before the emptiness check below: a pandas Series' bool() raises "truth value is ambiguous")
    try:
        choices, temperature = choice_list(choices), _python_value(temperature)
    except TypeError as e:  # (a dict)
        raise TypeError(f"{caller} {e}") from None
    problem = choices_problem(choices)  # (a %%lm cell's parser asks it too, for the same words)
    if problem:
        raise ValueError(f"{caller} {problem}")
    for c in choices:
        check_text(c, f"the {caller} choice")
    problem = select_temperature_problem(temperature)
    if problem:
        raise ValueError(f"{caller} {problem}")
    problem = choices_method_problem(choices_method)
    if problem:
        raise TypeError(problem)
    return Select(name, list(choices), float(temperature), choices_method)


def _role(role: str, expr: Any = None) -> ExprList:
    if expr is None:
        return ExprList([RoleBegin(role), RoleEnd(role)])
    return ExprList([RoleBegin(role), as_expr(expr), RoleEnd(role)])


def system(expr: Any = None) -> ExprList:
    """A system message with content ``expr`` (text and/or primitives)."""
    return _role("system", expr)


def user(expr: Any = None) -> ExprList:
    """A user message with content ``expr``."""
    return _role("user", expr)


def assistant(expr: Any = None) -> ExprList:
    """An assistant message with content ``expr`` (typically a ``gen``)."""
    return _role("assistant", expr)


def system_begin() -> RoleBegin:
    """Open a system message; the text added until ``system_end()`` is its content."""
    return RoleBegin("system")


def system_end() -> RoleEnd:
    """Close the system message opened by ``system_begin()``."""
    return RoleEnd("system")


def user_begin() -> RoleBegin:
    """Open a user message; the text added until ``user_end()`` is its content."""
    return RoleBegin("user")


def user_end() -> RoleEnd:
    """Close the user message opened by ``user_begin()``."""
    return RoleEnd("user")


def assistant_begin() -> RoleBegin:
    """Open an assistant message; the text added until ``assistant_end()`` is its content."""
    return RoleBegin("assistant")


def assistant_end() -> RoleEnd:
    """Close the assistant message opened by ``assistant_begin()``."""
    return RoleEnd("assistant")


@offering_keywords
def image(source: Any) -> Image:
    """An image input: a file path, ``PIL.Image.Image``, encoded bytes or ``data:image/...;base64``
    URL (http(s) URLs only with ``LMNB_ALLOW_REMOTE_MEDIA=1``). Runs with a LLaVA checkpoint on the
    in-process ``Engine`` or behind ``RuntimeEndpoint`` (the image's KV is reused by later prompts
    with the same pixels, paper §6), and on an ``OpenAI`` chat model; an ``OpenAI`` completion model
    raises ``NotImplementedError``; a bad image raises ``ValueError``."""
    return Image(source)


@offering_keywords
def video(source: Any, num_frames: int) -> Video:
    """A video file sampled uniformly to ``num_frames`` frames (decord, else PyAV, else Pillow),
    each given to the model as an image (its own placeholder and cache key). Same backends as
    ``image``. ``num_frames`` may be an integer of another type (numpy's), read as the int it holds.

    Raises:
        ValueError: ``num_frames`` is not an integer >= 1."""
    try:
        count = None if isinstance(num_frames, bool) else operator.index(num_frames)
    except TypeError:
        count = None
    if count is None or count < 1:
        raise ValueError(f"video() num_frames must be a positive integer, got {shown_value(num_frames)}")
    return Video(source, count)


def _batch_fix(batch_kwargs: Any) -> str:
    """The fix for a ``run_batch`` argument that is no list or tuple (SGLang's asserts one): a dict
    is one item's arguments; another iterable (a generator, ``map``) is made a list first;
    anything else gets no fix."""
    if isinstance(batch_kwargs, collections.abc.Mapping):
        return ": a dict is one run's arguments; pass [the dict] for a batch of one, or call run(**the dict)"
    if isinstance(batch_kwargs, collections.abc.Iterable) and not isinstance(batch_kwargs, (str, bytes)):
        return ": make it a list first, list(...)"
    return ""
