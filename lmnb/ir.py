"""What an lmnb program says: primitives as small expression classes (paper §2, Table 1).

The interpreter (``lmnb.interpreter``) decides how they run, the tracer (``lmnb.tracer``) reads
them without running, and every backend receives the resolved ``GenParams`` of a ``gen``. The split
and the meaning of every field follow SGLang's ``python/sglang/lang/ir.py``.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import re
import sys
from typing import Any, Callable, Optional, Sequence, Union

# Regular expressions for ``gen(dtype=...)``, SGLang's (``REGEX_INT`` etc.): the trailing
# ``[ \n]*`` lets the model end the number with a space or newline, which the added stop strings
# then cut off (the stop text is not returned).
REGEX_INT = r"[-+]?[0-9]+[ \n]*"
REGEX_FLOAT = r"[-+]?[0-9]*\.?[0-9]+([eE][-+]?[0-9]+)?[ \n]*"
REGEX_BOOL = r"(True|False)"
REGEX_STR = r"\"[\w\d\s]*\""  # a JSON string literal, quotes included, as SGLang writes it
DTYPE_STOPS = (" ", "\n")
# max_tokens of a gen that gives none, unless the run sets another (``run(max_new_tokens=...)``)
DEFAULT_MAX_NEW_TOKENS = 128

# gen() options each of which decides the whole output; a gen takes at most one of them.
OUTPUT_OPTIONS = ("regex", "json_schema", "dtype", "choices")


def output_clash(given: Sequence[str]) -> Optional[str]:
    """gen()'s words for more than one of ``OUTPUT_OPTIONS`` given (``given``, in that order), or
    None: a ``%%lm`` cell's literals and its values from variables are refused in the same words."""
    if len(given) < 2:
        return None
    return f"gen() takes one of {', '.join(given)}: they each decide the output; keep one"


def is_stop(value: Any) -> bool:
    """``value`` is a valid ``stop``: None, a string, or a list or tuple of strings."""
    return value is None or isinstance(value, str) or (
        isinstance(value, (list, tuple)) and all(isinstance(x, str) for x in value))


def _python_value(value: Any) -> Any:
    """``value`` with numpy scalars as Python values (``lmnb_engine.params.python_value``, the
    engine's own reading); with numpy not loaded there can be none, and a plain gen() loads
    nothing of the engine."""
    if "numpy" not in sys.modules:
        return value
    from lmnb_engine.params import python_value  # torch-free

    return python_value(value)


def check_flag(name: str, value: Any) -> Optional[bool]:
    """``value`` as a Python bool (None, "inherit", passes): True, False or a numpy bool (an
    ``np.bool_`` from an array or a comparison), refusing anything else: a truthy string such as
    "no" would otherwise mean yes, and 0 / 1 are numbers. The engine's ``SamplingParams`` refuses
    the same for ``ignore_eos``.

    Raises:
        TypeError: ``value`` is neither a bool, a numpy bool nor None.
    """
    value = _python_value(value)
    if value is None or isinstance(value, bool):
        return value
    raise TypeError(f"{name}={shown_value(value)} is invalid: must be True or False")


_PARAM_FIELDS = (
    "max_new_tokens",
    "min_new_tokens",
    "n",
    "stop",
    "stop_regex",
    "stop_token_ids",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "ignore_eos",
    "seed",
    "return_logprob",
    "logprob_start_len",
    "top_logprobs_num",
    "return_text_in_logprobs",
    "regex",
    "json_schema",
    "dtype",
    "logit_bias",
)


# The number options, each of which every backend refuses unless it holds an int (the first) or
# an int or a float (the second): a numpy array (``max_tokens=np.array([3])``) failed on a server
# backend in the JSON encoder's words ("Object of type ndarray is not JSON serializable"). Their
# ranges are checked by ``option_problem`` (``top_logprobs_num``'s lower bound on its own).
_INT_FIELDS = ("max_new_tokens", "min_new_tokens", "n", "top_k", "seed", "logprob_start_len")
_NUMBER_FIELDS = ("temperature", "top_p", "min_p", "frequency_penalty", "presence_penalty")
# The engine's (SGLang's) names of sampling parameters that ``gen()`` calls otherwise.
GEN_NAMES = {"max_new_tokens": "max_tokens", "min_new_tokens": "min_tokens"}
# gen() options whose range the engine's ``SamplingParams.validate`` checks, in its own words.
_ENGINE_RANGES = ("min_p", "frequency_penalty", "presence_penalty", "seed", "logprob_start_len")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    from lmnb_engine.params import finite_number  # torch-free: the engine's own reading

    return finite_number(value)


def shown_value(value: Any) -> str:
    """``value`` as the engine's messages show a caller's value (``lmnb_engine.params.shown_number``:
    a huge int, which Python will not write whole, in scientific form; a value whose repr raises, by
    its type), imported only for a message, so that valid calls load nothing of the engine. Every
    message of ``lmnb`` that shows a caller's value calls it."""
    from lmnb_engine.params import shown_number  # torch-free

    return shown_number(value)


def option_problem(key: str, value: Any) -> Optional[str]:
    """Why ``value`` cannot be the number option ``key`` of ``gen()`` (gen()'s name, one of
    max_tokens, min_tokens, n, temperature, top_p, top_k and ``_ENGINE_RANGES``), or None (for None,
    "inherit", too, and for other keys).

    The ranges are SGLang's (``SamplingParams.verify``; ``lmnb_engine.SamplingParams.validate``
    holds them too, and checks ``min_p``, the penalties, ``seed`` and ``logprob_start_len`` here in
    its own words), and ``n``'s upper bound the engine's (``lmnb_engine.params.MAX_N``, OpenAI's
    too), which no backend goes beyond usefully: ``gen()`` and ``run()`` refuse a value
    out of range where they are called, and a ``%%lm`` cell's parser refuses a literal one at its
    column, with this message, where before the backend refused it once the program ran. Values
    are Python's: numpy scalars are read first by the caller (``_python_value``).
    """
    if value is None:
        return None
    if key in ("max_tokens", "min_tokens") and not (_is_int(value) and value >= 0):
        return f"{key} must be an integer >= 0, got {shown_value(value)}"
    if key == "n" and not (_is_int(value) and value >= 1):
        return f"n must be an integer >= 1, got {shown_value(value)}"
    if key == "n" and value > 1:  # (n=1 needs no bound: a plain gen() loads nothing of the engine)
        from lmnb_engine.params import MAX_N  # torch-free; the engine's and lmnb serve's bound

        if value > MAX_N:
            return (f"n={shown_value(value)} is too many samples for one gen: at most {MAX_N} (the engine's, lmnb serve's and "
                    "OpenAI's limit); for more, make several gens, or fork and gen in each branch")
    if key == "temperature" and not (_is_number(value) and value >= 0):
        from lmnb_engine.params import TEMPERATURE_RULE  # the engine's words (no torch)

        return f"temperature {TEMPERATURE_RULE}, got {shown_value(value)}"
    if key == "top_p" and not (_is_number(value) and 0 < value <= 1):
        return f"top_p must be a number in (0, 1], got {shown_value(value)}"
    if key == "top_k" and not (_is_int(value) and (value >= 1 or value == -1)):
        return f"top_k must be an integer >= 1, or -1 for no limit, got {shown_value(value)}"
    if key in _ENGINE_RANGES:
        return engine_option_problem(key, value)
    return None


def engine_option_problem(key: str, value: Any) -> Optional[str]:
    """Why ``value`` is no valid ``key``, a ``SamplingParams`` field of that name, as the engine's own
    ``SamplingParams.validate`` says (torch-free), in the option's name; None when it is valid."""
    from lmnb_engine.params import SamplingParams

    try:
        SamplingParams(**{key: value}).validate()
    except ValueError as e:  # "SamplingParams.seed='a' is invalid: must be ..."
        return str(e).replace("SamplingParams.", "", 1)
    return None


def token_bounds_problem(max_tokens: Any, min_tokens: Any) -> Optional[str]:
    """Why a gen cannot have both ``max_tokens`` and ``min_tokens`` (each valid alone), or None:
    more tokens at least than at most, which SGLang and the engine refuse once the request is sent."""
    if _is_int(max_tokens) and _is_int(min_tokens) and min_tokens > max_tokens:
        return (f"min_tokens={shown_value(min_tokens)} must not exceed max_tokens={shown_value(max_tokens)}; lower min_tokens "
                "or raise max_tokens")
    return None


@dataclasses.dataclass
class GenParams:
    """Sampling parameters of one ``gen``; ``None`` means "inherit the program-wide default".

    Field names and meanings are SGLang's (``SglSamplingParams``): ``max_new_tokens`` and
    ``min_new_tokens`` count tokens; ``temperature`` 0 is greedy; ``top_k`` -1 is off; ``seed`` makes sampling reproducible (an lmnb extension; SGLang's server
    calls it ``sampling_seed``); ``stop`` is a
    string or a list of strings (matched on the text, not returned); ``stop_regex`` (SGLang's
    server parameter, an lmnb extension in the language) is a pattern or a list of them, matched
    the same way (see ``lmnb_engine.SamplingParams``); ``logprob_start_len`` is a
    prompt-token index. ``regex`` and ``json_schema`` (a JSON string or a dict) constrain the output
    and are passed to the backend unchanged. ``dtype`` (``int``, ``float``, ``bool``, ``str``)
    becomes a regex and, for int/float/bool, a parsed value (see ``dtype_regex``). ``logit_bias``
    (OpenAI's and SGLang's, an lmnb extension in the language) is ``{token id: bias in [-100, 100]}``,
    read as the engine reads it (``lmnb_engine.params.logit_bias_value``: ids given as their decimal
    text become ints); an empty one is None.
    """

    max_new_tokens: Optional[int] = None
    min_new_tokens: Optional[int] = None
    n: Optional[int] = None
    stop: Optional[Union[str, list[str]]] = None
    stop_regex: Optional[Union[str, list[str]]] = None
    stop_token_ids: Optional[list[int]] = None
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    top_k: Optional[int] = None
    min_p: Optional[float] = None
    frequency_penalty: Optional[float] = None
    presence_penalty: Optional[float] = None
    ignore_eos: Optional[bool] = None
    seed: Optional[int] = None
    return_logprob: Optional[bool] = None
    logprob_start_len: Optional[int] = None
    top_logprobs_num: Optional[int] = None
    return_text_in_logprobs: Optional[bool] = None
    regex: Optional[str] = None
    json_schema: Optional[Union[str, dict, bool]] = None
    dtype: Optional[Any] = None
    logit_bias: Optional[dict[int, float]] = None

    def __post_init__(self) -> None:
        for f in _PARAM_FIELDS:  # numpy scalars as Python values, as the engine takes them (and for JSON)
            setattr(self, f, _python_value(getattr(self, f)))
        for flag in ("ignore_eos", "return_logprob", "return_text_in_logprobs"):
            setattr(self, flag, check_flag(flag, getattr(self, flag)))
        for f in _INT_FIELDS + _NUMBER_FIELDS:
            v, whole = getattr(self, f), f in _INT_FIELDS
            if v is not None and (isinstance(v, bool) or not isinstance(v, int if whole else (int, float))):
                raise TypeError(f"{GEN_NAMES.get(f, f)}={shown_value(v)} is invalid: must be "
                                f"{'an integer' if whole else 'a number (an int or a float)'}")
            problem = option_problem(GEN_NAMES.get(f, f), v)
            if problem:  # (here, where gen() or run() was called, not once the backend got it)
                raise ValueError(problem)
        # Checked here, where gen() or run() was called: the engine would name the merged list
        # (with the chat template's stops in it), and a non-list would fail deep inside.
        if not is_stop(self.stop):
            raise TypeError(f"stop={shown_value(self.stop)} is invalid: give a string or a list of strings")
        if self.stop is not None:  # (a plain gen() loads nothing of the engine)
            from lmnb_engine.params import stop_problem  # torch-free: the engine's own rule

            problem = stop_problem(self.stop)
            if problem:  # (the value not shown: it may be hundreds of strings)
                raise ValueError(f"stop is invalid: {problem}")
        ids = self.stop_token_ids
        if ids is not None and not (isinstance(ids, (list, tuple)) and all(
                isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids)):
            raise TypeError(f"stop_token_ids={shown_value(ids)} is invalid: give a list of non-negative token ids")
        # Only what every backend refuses: the upper bound is the backend's own (the engine and
        # lmnb serve take 20, OpenAI's chat API 20 and its completions API 5, an SGLang server
        # sets none), so it is left to the backend, which names it.
        k = self.top_logprobs_num
        if k is not None and (not isinstance(k, int) or isinstance(k, bool) or k < 0):
            raise ValueError(f"top_logprobs_num={shown_value(k)} is invalid: give a count of top alternatives per token, "
                             "an integer >= 0")
        if self.logit_bias is not None:  # (a plain gen() loads nothing of the engine)
            from lmnb_engine.params import logit_bias_value  # torch-free: the engine's own rule

            try:  # (an empty one biases nothing: None, as a gen without one, which every reader compares it to)
                self.logit_bias = logit_bias_value(self.logit_bias) or None
            except ValueError as e:  # (in gen()'s name for it, which is the engine's)
                raise (TypeError if not isinstance(self.logit_bias, dict) else ValueError)(
                    str(e).replace("SamplingParams.", "", 1)) from None

    def merged_over(self, defaults: "GenParams") -> "GenParams":
        """These values where set, ``defaults`` elsewhere (a new object; lists are copied)."""
        out = {}
        for f in _PARAM_FIELDS:
            v = getattr(self, f)
            out[f] = v if v is not None else getattr(defaults, f)
        for key in ("stop", "stop_regex"):
            if isinstance(out[key], (list, tuple)):
                out[key] = list(out[key])
        if out["logit_bias"] is not None:
            out["logit_bias"] = dict(out["logit_bias"])
        return GenParams(**out)

    @property
    def stop_list(self) -> list[str]:
        """``stop`` as a list."""
        from lmnb_engine.params import as_list  # torch-free: the engine's own reading

        return as_list(self.stop)

    @property
    def stop_regexes(self) -> list[str]:
        """``stop_regex`` as a list."""
        from lmnb_engine.params import as_list

        return as_list(self.stop_regex)

    def first_stop_match(self, text: str, at_end: bool = False) -> Optional[tuple[int, str]]:
        """``(where it begins, the text it matched)`` of the first stop in ``text`` (a stop string,
        or a ``stop_regex`` match), None if none: the matched text is the engine's
        ``finish_reason.matched``. For text that is already whole (API speculative execution), the
        stop the engine finds as tokens arrive: the match that ends first, and among those ending
        at one character the first listed, stop strings before regexes (``StopStringMatcher.find``).
        ``at_end``: the output ends with ``text`` (an EOS or stop token), where a ``stop_regex``
        match that reads the text's end (``a$``, ``\\bEND\\b``) is a stop; else more text follows
        it, which may undo such a match, or max tokens cut it there, and it is none
        (``StopStringMatcher.find``, ``Scheduler._stop_at_end``).

        Raises:
            ValueError: a ``stop_regex`` search ran past the engine's time limit (catastrophic
                backtracking), as the engine aborts such a request: taken as "no stop", the gen
                would silently take the whole text.
        """
        from lmnb_engine.stop_matcher import StopStringMatcher  # (torch-free: the engine's own rule)

        matcher = StopStringMatcher(self.stop_list, self.stop_regexes)
        hit = matcher.find(text, 0, at_end=at_end)
        if matcher.problem:
            raise ValueError(matcher.problem)
        return hit

    def with_stops(self, extra: Sequence[str]) -> "GenParams":
        """A copy whose ``stop`` list also holds ``extra`` (order kept, no duplicates)."""
        stops = self.stop_list
        stops += [s for s in extra if s and s not in stops]
        return dataclasses.replace(self, stop=stops)

    def sampling_kwargs(self) -> dict[str, Any]:
        """The fields that SGLang's ``sampling_params`` object carries (set fields only)."""
        keys = (
            "max_new_tokens", "min_new_tokens", "n", "stop_token_ids", "temperature", "top_p",
            "top_k", "min_p", "frequency_penalty", "presence_penalty", "ignore_eos", "seed",
            "regex", "json_schema", "logit_bias",
        )
        out = {k: getattr(self, k) for k in keys if getattr(self, k) is not None}
        if self.stop_list:
            out["stop"] = self.stop_list
        if self.stop_regexes:
            out["stop_regex"] = self.stop_regexes
        return out


# gen() options (gen()'s names) that ``GenParams`` checks each alone, where gen() is called: a %%lm
# cell's parser checks a literal one so (``param_problem``), for the same words.
CHECKED_ALONE = ("max_tokens", "min_tokens", "n", "stop", "stop_token_ids", "temperature", "top_p", "top_k", "min_p",
                 "frequency_penalty", "presence_penalty", "ignore_eos", "seed", "return_logprob", "logprob_start_len",
                 "top_logprobs_num", "return_text_in_logprobs", "logit_bias")


def param_problem(key: str, value: Any) -> Optional[str]:
    """What ``gen()`` says of ``value`` as its option ``key`` (one of ``CHECKED_ALONE``) given
    alone: the message of the ``TypeError`` (a value of the wrong type) or ``ValueError`` (out of
    range, ``option_problem``) that ``GenParams`` raises, or None where it takes the value."""
    field = next((f for f, name in GEN_NAMES.items() if name == key), key)
    try:
        GenParams(**{field: value})
    except (TypeError, ValueError) as e:
        return str(e)
    return None


# How the Python API names a run's default max_tokens (``{}``: the number), which a front end that
# runs programs for its own option names otherwise (``executor.max_tokens_option``).
RUN_MAX_TOKENS_OPTION = "run(max_new_tokens={})"


@dataclasses.dataclass
class RunDefaults(GenParams):
    """A run's defaults for its gens (``run()``'s sampling arguments), which know where their
    ``max_new_tokens`` came from, so that an error about it can say so (``max_tokens_note``).

    Attributes:
        max_tokens_option: the front end's option that sets a run's ``max_new_tokens``, ``{}``
            where the number goes: ``RUN_MAX_TOKENS_OPTION``, a ``%%lm`` cell's
            ``"the cell's --max-tokens {}"``.
        max_tokens_given: the run was given its ``max_new_tokens`` (through that option); False:
            it is lmnb's built-in ``DEFAULT_MAX_NEW_TOKENS``.
    """

    max_tokens_option: str = RUN_MAX_TOKENS_OPTION
    max_tokens_given: bool = False

    def __post_init__(self) -> None:
        """Check ``max_new_tokens`` in the option's own words, before ``GenParams``' checks, which
        name a gen's ``max_tokens``: ``run(max_new_tokens="3")`` was refused as "max_tokens='3'
        is invalid", and a negative count failed each gen as "max_tokens=-1 is invalid", an
        option the program never wrote.

        Raises:
            TypeError: ``max_new_tokens`` is not an integer.
            ValueError: it is below 0.
        """
        n = _python_value(self.max_new_tokens)
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            error = ValueError if isinstance(n, int) and not isinstance(n, bool) else TypeError
            raise error(f"{self.max_tokens_option.format(shown_value(n))} is invalid: must be an integer >= 0")
        super().__post_init__()

    def max_tokens_note(self) -> str:
        """What to say of a gen without its own ``max_tokens`` whose request did not fit for the
        ``max_new_tokens`` it took from these defaults: where that number came from, and the fix
        in the front end's words."""
        n = self.max_new_tokens
        if self.max_tokens_given:
            option = self.max_tokens_option.format(shown_value(n))
            return f"the gen has no max_tokens of its own and took {option}: give it its own max_tokens=N, or lower that"
        return (f"the gen has no max_tokens of its own and took lmnb's default of {n}: give it its own max_tokens=N, "
                f"or set {self.max_tokens_option.format('N')}")


def dtype_regex(dtype: Any) -> tuple[str, Callable[[str], Any]]:
    """``(regex, parse)`` for ``gen(dtype=...)``: int, float, bool or str (also their names).

    The regexes are SGLang's (``runtime_endpoint._handle_dtype_to_regex``); unlike SGLang, the
    variable holds the parsed value (``int``/``float``/``bool``), while the text keeps the string.

    Raises:
        ValueError: another dtype.
    """
    name = dtype if isinstance(dtype, str) else getattr(dtype, "__name__", None)
    table: dict[str, tuple[str, Callable[[str], Any]]] = {
        "int": (REGEX_INT, lambda t: int(t.strip())),
        "float": (REGEX_FLOAT, lambda t: float(t.strip())),
        "bool": (REGEX_BOOL, lambda t: {"True": True, "False": False}[t.strip()]),
        "str": (REGEX_STR, lambda t: t),
        "string": (REGEX_STR, lambda t: t),
    }
    if name not in table:
        raise ValueError(f"gen(dtype={shown_value(dtype)}) is not supported; use int, float, bool or str")
    return table[name]


def dtype_prefix(dtype: Any, text: str) -> bool:
    """Whether ``text`` is the start of some value of ``gen(dtype=...)`` (``dtype_regex``): some
    continuation (possibly none) would make it one (``""`` and ``"-"`` for int; ``"1e"`` for float;
    ``"Tr"`` for bool), leading whitespace aside, which the parse strips. Read with the ``regex``
    package's partial matching, which also matches text that ends before a match could.

    Raises:
        ValueError: a dtype ``dtype_regex`` refuses.
    """
    import regex  # (a dependency of transformers, declared by lmnb too; not loaded for import lmnb)

    return regex.fullmatch(dtype_regex(dtype)[0], text.lstrip(), partial=True) is not None


class Expr:
    """Base of every primitive. ``a + b`` builds an ``ExprList``; strings become ``ConstantText``.

    ``cell_offset``: where a ``%%lm`` cell wrote it (the character offset of its hole in the cell
    body, set by the cell's interpreter), so that the cell's error points there; None elsewhere.
    ``cell_hole``: that hole as the cell wrote it (``{image img}``), which names it in its failure
    as it runs; None names it by its repr (``Gen('x')``).
    """

    cell_offset: Optional[int] = None
    cell_hole: Optional[str] = None

    def __add__(self, other: Any) -> "ExprList":
        return ExprList([self, as_expr(other)])

    def __radd__(self, other: Any) -> "ExprList":
        return ExprList([as_expr(other), self])

    def __format__(self, spec: str) -> str:
        """Refuse to become text in an f-string or ``format()``: ``s += f"A: {gen('a')}"`` added the
        text "A: Gen('a')" and ran no gen. ``str()``, ``repr()`` and ``f"{x!r}"`` still show the repr.

        Raises:
            TypeError: naming the primitive and how to add it to the state.
        """
        shown = repr(self)
        shown = shown if len(shown) <= 120 else f"{shown[:100]} ... {shown[-15:]}"  # ("A: " + a long text)
        what = "holds lmnb primitives" if isinstance(self, ExprList) else "is an lmnb primitive"
        raise TypeError(
            f"{shown} {what}: in an f-string or format() it becomes its repr as text and never runs; "
            'add it to the state instead: s += "A: " + lmnb.gen(...) (or s += "A: ", then s += lmnb.gen(...)), '
            'not s += f"A: {lmnb.gen(...)}"; for the repr itself (debugging), write {x!r} or repr(x)')


def check_text(text: str, what: str) -> None:
    """Refuse ``text`` (``what`` names it) holding a lone UTF-16 surrogate (a file read with
    ``errors="surrogateescape"``, half of a JSON ``\\ud83d\\ude00`` escape): no backend can send it,
    and each failed in its own words (the tokenizer's "TextEncodeInput must be Union[...]").

    Raises:
        ValueError: naming the character, its position and the fix (the engine's own wording).
    """
    from lmnb_engine.tokenizer import lone_surrogate_problem  # torch-free, as the engine refuses such text

    problem = lone_surrogate_problem(text)
    if problem:
        raise ValueError(f"{what} {problem}")


def as_expr(x: Any) -> Expr:
    """A string as ``ConstantText``, an ``Expr`` as is.

    Raises:
        TypeError: None (said as such); bytes, a bytearray or a memoryview (saying to decode them); a
            program or the state of one (saying to call ``program.func(s, ...)``); anything else
            (naming the type, to convert with ``str()``).
        ValueError: a string holding a lone surrogate (``check_text``).
    """
    if isinstance(x, Expr):
        return x
    if isinstance(x, str):
        check_text(x, "the text")
        return ConstantText(x)
    if x is None:  # (most often a helper's result that returns nothing, not a value to convert)
        raise TypeError("cannot add None to an lmnb program (a function that returns nothing?); add a str or a "
                        "primitive such as gen(...)")
    if isinstance(x, (bytes, bytearray, memoryview)):  # (str() of bytes is their repr, b'...', not their text)
        decode = "bytes(value).decode" if isinstance(x, memoryview) else "value.decode"  # (a memoryview has none)
        raise TypeError(f"cannot add {type(x).__name__} to an lmnb program; decode them to text first, "
                        f"{decode}(\"utf-8\") (for an image's bytes: image(value))")
    from lmnb.api import SglFunction  # (here, not at the top: both modules import this one)
    from lmnb.interpreter import ProgramState

    if isinstance(x, ProgramState):  # (str() of it is no text a program means)
        raise TypeError("cannot add a ProgramState to an lmnb program: calling a @function, s += other(...), runs "
                        "it as a program of its own and returns its state; to run its body on this state, call "
                        "other.func(s, ...), or add that state's text, other(...).text()")
    if isinstance(x, SglFunction):
        raise TypeError(f"cannot add the program {x.__name__!r} itself to an lmnb program; to run its body on this "
                        f"state, call {x.__name__}.func(s, ...)")
    raise TypeError(
        f"cannot add a value of type {type(x).__name__} to an lmnb program; add a str (e.g. str(value)) or a "
        "primitive such as gen(...)"
    )


class ExprList(Expr):
    """A sequence of expressions run in order."""

    def __init__(self, exprs: Sequence[Expr]):
        flat: list[Expr] = []
        for e in exprs:
            flat.extend(e.exprs if isinstance(e, ExprList) else [e])
        self.exprs = flat

    def __repr__(self) -> str:
        return f"ExprList({self.exprs!r})"


class ConstantText(Expr):
    """Text appended to the prompt as is (paper: "extend")."""

    def __init__(self, value: str):
        self.value = value

    def __repr__(self) -> str:
        return f"ConstantText({self.value!r})"


class Gen(Expr):
    """Generate text from the model and store it in variable ``name`` (None: text only).

    ``model``: the pydantic class given as ``json_schema``, which the output is validated with (its
    validators are code, which the schema in ``params`` cannot hold).
    """

    def __init__(self, name: Optional[str], params: GenParams, model: Optional[type] = None):
        self.name = name
        self.params = params
        self.model = model

    def __repr__(self) -> str:
        return f"Gen({self.name!r})"


class Select(Expr):
    """Pick one of ``choices`` by the model's (normalized) likelihood; see ``lmnb.choices``."""

    def __init__(self, name: Optional[str], choices: list[str], temperature: float, choices_method):
        self.name = name
        self.choices = choices
        self.temperature = temperature
        self.choices_method = choices_method

    def __repr__(self) -> str:
        return f"Select({self.name!r}, choices={self.choices!r})"


class RoleBegin(Expr):
    """Start a chat message of ``role`` (appends the chat template's prefix)."""

    def __init__(self, role: str):
        self.role = role

    def __repr__(self) -> str:
        return f"RoleBegin({self.role!r})"


class RoleEnd(Expr):
    """End the chat message of ``role`` (appends the suffix, records the message)."""

    def __init__(self, role: str):
        self.role = role

    def __repr__(self) -> str:
        return f"RoleEnd({self.role!r})"


def role_message(role: str, expr: Any, owner: object) -> ExprList:
    """What ``s.user(expr)`` (or system/assistant) submits to state ``owner`` and returns, as
    SGLang's does: the message, marked so that ``owner`` refuses it if it is added again
    (``s += s.user(x)`` would write the message twice; ``added_twice`` says so)."""
    message = ExprList([RoleBegin(role), as_expr(expr), RoleEnd(role)])
    message._submitted_by_role = (role, owner)
    return message


def added_twice(expr: Any, owner: object) -> None:
    """Refuse ``expr`` being added to ``owner`` when ``owner.<role>(...)`` submitted it already.

    Raises:
        ValueError: ``s += s.user(x)``, naming the two ways to write it once.
    """
    role = getattr(expr, "_submitted_by_role", None)
    if role is not None and role[1] is owner:
        raise ValueError(f"s.{role[0]}(...) adds its message itself; s += s.{role[0]}(...) would add it twice: "
                         f"write s.{role[0]}(...) alone, or s += lmnb.{role[0]}(...)")


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+(?=>)")


def _source_repr(source: Any) -> str:
    """``repr(source)`` (``shown_value``'s) of a media source as an error names it: on one line,
    without the memory address of a default repr (a PIL image's "<PIL.Image.Image image mode=RGB size=8x8 at
    0x7F63B49DABD0>"), cut to 60 characters (a data URL or bytes may be megabytes)."""
    text = " ".join(_ADDRESS.sub("", shown_value(source)).split())  # (shown_value: an int of 5000 digits has no repr)
    return text if len(text) <= 60 else text[:59] + "…"


class Image(Expr):
    """An image input (path, PIL image, bytes or data URL); see ``lmnb.image``."""

    def __init__(self, source: Any):
        self.source = source

    def __repr__(self) -> str:
        return f"Image({_source_repr(self.source)})"


class Video(Expr):
    """A video input sampled to ``num_frames`` frames; see ``lmnb.video``."""

    def __init__(self, source: Any, num_frames: int):
        self.source = source
        self.num_frames = num_frames

    def __repr__(self) -> str:
        return f"Video({_source_repr(self.source)}, {shown_value(self.num_frames)})"


class VarScopeBegin(Expr):
    """Start capturing the text appended from here into variable ``name``."""

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return f"VarScopeBegin({self.name!r})"


class VarScopeEnd(Expr):
    """Stop capturing into variable ``name``."""

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return f"VarScopeEnd({self.name!r})"


class CommitLazy(Expr):
    """Prefill the text so far into the backend's prefix cache (``max_new_tokens=0``).

    Submitted by ``fork(n>1)`` so the shared prefix is computed once before the branches start —
    the frontend hint of paper §3.
    """

    def __repr__(self) -> str:  # how an error names it (the default repr showed an object address)
        return "the prefill of the text before fork()"


def json_schema_value(schema: Any) -> Union[str, dict, bool, None]:
    """A JSON schema given as a str, a dict, a bool (JSON Schema's ``true``: any value), or a
    pydantic model class → the str, dict or bool, unchanged but for the class.

    A str, dict or bool, and a pydantic class's schema, is checked here, with the engine's own
    check and words (``lmnb_engine.json_schema.loaded_schema``: JSON, a JSON object or boolean,
    valid under the JSON Schema meta-schema), so a typo (``{"type": "strng"}``) fails at the ``gen`` call rather
    than once the program runs, whichever backend runs it. Whether the engine's constrained
    decoder supports every keyword, whether a ``pattern`` is a regex of the backend's dialect and
    whether the engine's regex of the schema is within its size limit (``engine=False`` there: only
    a pattern no dialect reads, ``a(b``, and a JSON text too large to send, are refused here), are
    left to the backend: another may take what it does not.

    Raises:
        TypeError: any other type; ValueError: a schema ``loaded_schema`` refuses (``false`` too:
            no output could validate).
    """
    if schema is None:
        return schema
    if isinstance(schema, (str, dict, bool)):
        return _checked_schema(schema)
    if isinstance(schema, type) and hasattr(schema, "model_json_schema"):
        from lmnb_engine.pydantic_schema import pydantic_json_schema  # torch-free

        try:  # (checked as a dict is: a class whose regex_engine is python-re may hold a back-reference)
            return _checked_schema(pydantic_json_schema(schema))
        except ValueError as e:
            raise ValueError(f"json_schema {schema.__name__}: {e}") from None
    raise TypeError(
        f"json_schema must be a JSON string, a dict, a bool or a pydantic model class, not {type(schema).__name__}"
    )


def _checked_schema(schema: Union[str, dict, bool]) -> Union[str, dict, bool]:
    """``schema``, which ``loaded_schema`` (``engine=False``) takes, as it is.

    Raises:
        ValueError: ``loaded_schema``'s refusal, in its own words, its keys in their own order."""
    if isinstance(schema, dict):  # first: _schema_passed's json.dumps visits each path (2**30 where
        from lmnb_engine.json_schema import copies_problem  # a Python-built schema shares objects)

        copies_problem(schema, engine=False)
    if not _schema_passed(schema):
        from lmnb_engine.json_schema import loaded_schema  # torch-free

        loaded_schema(schema, engine=False)
    return schema


def _schema_passed(schema: Union[str, dict, bool]) -> bool:
    """Whether ``loaded_schema`` takes ``schema``, remembered by its JSON text (a dict's keys
    sorted): a program body's ``gen()`` runs once per ``run_batch`` item, and the check of a schema
    of some dozens of properties takes milliseconds. False where unsure (a dict JSON cannot write
    with sorted keys, a bool: cheap to check)."""
    if isinstance(schema, bool):
        return False
    try:
        text = schema if isinstance(schema, str) else json.dumps(schema, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return False
    return _schema_text_passes(text)


@functools.lru_cache(maxsize=256)
def _schema_text_passes(text: str) -> bool:
    """Whether ``loaded_schema`` takes the schema written as JSON ``text`` (``_schema_passed``)."""
    from lmnb_engine.json_schema import loaded_schema  # torch-free

    try:
        loaded_schema(text, engine=False)
    except ValueError:
        return False
    return True


def did_you_mean(words: Sequence[str], *tiers: tuple[str, Any]) -> str:
    """``lmnb_engine.suggest.did_you_mean``: the "; did you mean ...?" ending a refusal of the
    unknown ``words``, offered from ``tiers``."""
    from lmnb_engine.suggest import did_you_mean as offer  # (here: importing lmnb loads no lmnb_engine module)

    return offer(words, *tiers)


def unexpected_keywords(words: Sequence[str]) -> str:
    """``lmnb_engine.suggest.unexpected_keywords``: ``an unexpected keyword argument 'a'``, or
    ``unexpected keyword arguments 'a', 'b'``."""
    from lmnb_engine.suggest import unexpected_keywords as named  # (as did_you_mean)

    return named(words)


def unexpected_keyword(call: str, kwargs: dict, accepted) -> None:
    """Python's own TypeError for the keywords of ``kwargs`` that ``call`` (``gen``, ``gen_int``,
    ``fork``, ...) has no parameter for, naming every one of them (Python's names the first), each
    offered the closest of ``accepted`` (``did_you_mean``), as a ``%%lm`` cell's options are.

    Raises:
        TypeError: a keyword not in ``accepted``."""
    unknown = [k for k in kwargs if k not in accepted]
    if unknown:
        raise TypeError(f"{call}() got {unexpected_keywords(unknown)}{did_you_mean(unknown, ('', accepted))}")


def offering_keywords(primitive: Callable) -> Callable:
    """``primitive`` (``gen``, ``select``, ``image``, ``video``, a state's ``fork``) refusing
    unknown keywords with "did you mean" (``unexpected_keyword``), before Python's TypeError would
    name only the first, with no offer."""
    accepted = frozenset(inspect.signature(primitive).parameters) - {"self"}

    @functools.wraps(primitive)  # (inspect.signature and help() still show the primitive's own parameters)
    def checked(*args, **kwargs):
        __tracebackhide__ = True  # see lmnb.interpreter._run_body
        if not accepted.issuperset(kwargs):
            unexpected_keyword(primitive.__name__, kwargs, accepted)
        return primitive(*args, **kwargs)

    return checked


def blank_name(name: str, stored: str) -> str:
    """What an empty or whitespace-only variable name ``name`` is, for a message: ``empty (""), so
    the <stored> could only be read as s[""]``, or ``only whitespace (" "), ...`` (JSON-quoted, so
    a tab or an ideographic space shows as its escape)."""
    shown = json.dumps(name)
    return f"{'empty' if not name else 'only whitespace'} ({shown}), so the {stored} could only be read as s[{shown}]"


def stop_regex_refusal(stop_regex: Any) -> Optional[str]:
    """Why ``stop_regex`` is refused, in the words of ``gen()``, ``run()`` and a ``%%lm`` cell's
    literal alike (``stop_regex="(" is invalid: "(" is not a valid regular expression ...``), by the
    engine's own rule; None where it is taken."""
    if stop_regex is None:  # (a plain gen() loads nothing of the engine)
        return None
    from lmnb_engine.json_schema import SHOWN_CHARS, json_value  # torch-free
    from lmnb_engine.params import MAX_STOP_REGEXES, stop_regex_problem

    problem = stop_regex_problem(stop_regex)
    if not problem:
        return None
    # (too many patterns are counted, not shown; the shown ones as JSON, as the engine shows them)
    many = isinstance(stop_regex, (list, tuple)) and len(stop_regex) > MAX_STOP_REGEXES
    shown = "" if many else f"={json_value(stop_regex, SHOWN_CHARS)}"
    return f"stop_regex{shown} is invalid: {problem}"


def check_stop_regex(stop_regex: Any) -> None:
    """Check ``gen(stop_regex=...)`` (or ``run``'s) where it is called, with the engine's own rule.

    Raises:
        ValueError: not a pattern or a list of them, an invalid pattern (``regex`` package syntax),
            one that matches the empty string, or more patterns than the engine takes
            (``stop_regex_refusal``'s words).
    """
    refusal = stop_regex_refusal(stop_regex)
    if refusal:
        raise ValueError(refusal)


def check_regex(regex: Optional[str]) -> None:
    """Compile ``regex`` client-side so a typo fails at the ``gen`` call, as in SGLang.

    Raises:
        ValueError: not a string, not a valid Python regular expression, or nested too deeply
            for Python's parser (some hundreds of parentheses), worded as ``%%lm`` cells word it,
            and an invalid pattern as the engine words it (``lmnb_engine.regex_errors.regex_problem``).
    """
    if regex is None:  # (a plain gen() loads nothing of the engine)
        return
    from lmnb_engine.regex_errors import regex_problem  # torch-free

    problem = regex_problem(regex)
    if problem:
        raise ValueError(problem)
