"""Sampling parameters of one generation request.

Field names and defaults follow SGLang's ``SamplingParams`` (``python/sglang/srt/sampling/
sampling_params.py``) so that programs written for SGLang mean the same thing here.
"""

from __future__ import annotations

import functools
import json
import math
import re
import sys
from dataclasses import dataclass, field, fields, replace
from typing import Any, Iterable, Iterator, Optional

from lmnb_engine.json_schema import SHOWN_CHARS, TOO_DEEP, json_value
from lmnb_engine.regex_empty_class import empty_class_problem
from lmnb_engine.regex_parts import pattern_parts
from lmnb_engine.regex_python_error import python_error, shown_regex
from lmnb_engine.regex_stop_posix import stop_posix_problem
from lmnb_engine.regex_never import never_problem
from lmnb_engine.suggest import did_you_mean, unexpected_keywords
from lmnb_engine.tokenizer import lone_surrogate_problem


# Temperatures below this sample greedily (SGLang's _SAMPLING_EPS): logits / 1e-300 is inf, and
# softmax of inf is NaN, so such a "sample" was noise.
SAMPLING_EPS = 1e-6
# Bounds on ``stop``: each string is looked for after every token, on the scheduler's thread, so a
# request with thousands of long stops slowed every request (OpenAI's API takes 4; SGLang and vLLM
# set no bound).
MAX_STOP_STRINGS = 512
MAX_STOP_CHARS = 32768
# Bound on ``stop_regex``: each pattern is read after every token (for a match, and for where
# one may yet begin), on the scheduler's thread, by an automaton or by searches of up to
# ``stop_matcher.REGEX_TIMEOUT_S`` each. Patterns join into one with ``|``, so a few suffice.
MAX_STOP_REGEXES = 32
# Bound on ``top_logprobs_num``, the OpenAI routes' too (OpenAI's API takes 0 to 20): a stream's
# every event resends the alternatives of every token so far, so its size grows with this times
# the square of the output's length (one stream asking for thousands reached 582 MB).
MAX_TOP_LOGPROBS = 20
# Bound on ``n``, the samples of one request (OpenAI's API has the same): each sample is a
# scheduler request of its own, so on lmnb serve n=100000 queued 100000 of them and starved every
# other client for minutes, and in process n=10**6 grew to 4.3 GB before its first token.
MAX_N = 128
# What a temperature must be, in the words of every front end that checks one (``validate``,
# ``gen()`` and ``run()`` through ``lmnb.ir.option_problem``, a ``%%lm`` cell's ``--temperature``):
# NaN and inf compare as neither below nor above 0, so "finite" is said.
TEMPERATURE_RULE = "must be a finite number >= 0 (0 is greedy)"
# Why ``top_logprobs_num`` above 0 is refused without ``return_logprob``, in the words of
# ``validate`` and of lmnb's gen (``lmnb.executor``, which refuses a gen's own for every backend: an
# OpenAI API and an SGLang server drop it without a word).
TOP_LOGPROBS_RULE = ("the top alternatives come only with the logprobs: also ask for return_logprob, or leave "
                     "top_logprobs_num out")
# Bound on a ``logit_bias`` value, OpenAI's API's: +100 makes a token all but certain and -100 all
# but banned whatever the model's logits, so a larger bias changes nothing more.
MAX_LOGIT_BIAS = 100.0
# A token id written as text, as OpenAI's API and SGLang's ``logit_bias`` take them (JSON's keys
# are strings): decimal digits, a sign allowed so that "-1" is told it is out of range, not no id.
_ID_TEXT = re.compile(r"[-+]?[0-9]+")


def finite_number(v: Any) -> bool:
    """Whether ``v`` is an int or float (not a bool) that a float holds finitely: NaN, the
    infinities and an int past float's range (``10**400``, which JSON and Python write exactly,
    and ``float()`` refuses with an OverflowError) are not."""
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return False
    try:
        return math.isfinite(v)
    except OverflowError:
        return False


def decimal_digits(value: int) -> int:
    """How many decimal digits ``abs(value)`` has (0 has one), worked out without writing it:
    ``str()`` refuses an int of more digits than ``sys.get_int_max_str_digits()``."""
    size = abs(value)
    if size < 10:
        return 1
    exponent = math.floor(math.log10(size))  # (log10 reads an int of any size, but may round across a power of 10)
    return exponent + 1 + (size >= 10 ** (exponent + 1)) - (size < 10**exponent)


def digits_over_limit(digits: int) -> bool:
    """Whether Python refuses to write or read an integer of ``digits`` decimal digits (its
    ``int_max_str_digits``, ``sys.get_int_max_str_digits()``, 4300 by default; 0 is no limit):
    ``str()``, ``repr()``, f-strings, ``json.dumps`` of a larger int and ``int()``, ``json.loads``
    of a longer literal raise ``ValueError: Exceeds the limit (4300 digits) for integer string
    conversion``. The one rule of every check of an integer's length (of an int: ``decimal_digits``;
    of a text: its digit characters, leading zeros too, as ``int()`` counts them)."""
    limit = sys.get_int_max_str_digits()
    return 0 < limit < digits


def shown_number(value: Any) -> str:
    """``value`` as a message shows it: its ``repr``, except an int of more than ``SHOWN_CHARS``
    digits, in scientific form with its digit count (``1.000e+5000 (an integer of 5001 digits)``):
    Python refuses to write an int of over 4300 digits (``digits_over_limit``), so a message that
    wrote one failed itself with a ValueError naming that limit. A value whose ``repr`` fails so (a
    list holding such an int) is named by its type and the int's index (``a list holding an integer
    too long to write at [1]``). Every message that may show a caller's value
    of any type uses it (``validate``, ``gen()``'s and a ``%%lm`` cell's checks through
    ``lmnb.ir.option_problem``, ``select()``, the backends' constructors); a value whose ``repr``
    raises anything else (a user's class) is named by its type too, so the message is still made."""
    if isinstance(value, int) and not isinstance(value, bool):
        digits = decimal_digits(value)
        if digits > SHOWN_CHARS:
            return _scientific(value < 0, abs(value) // 10 ** (digits - 5), digits)
    try:
        return repr(value)
    except Exception as e:  # noqa: BLE001 - a user's __repr__ may raise anything
        said = e.args[0] if isinstance(e, ValueError) and e.args else None
        if isinstance(said, str) and "integer string conversion" in said:  # (an int too long in a container)
            return f"a {type(value).__name__} holding an integer too long to write{_long_integer_index(value)}"
        return f"<a {type(value).__name__} whose repr raised {type(e).__name__}>"


def outside_vocabulary(ids: Iterable[int], vocab_size: int) -> tuple[list[int], str]:
    """The token ids of ``ids`` outside ``[0, vocab_size)``, and the first five of them as a
    message shows them (``shown_number``: one of 5000 digits, which Python writes as no int)."""
    bad = [t for t in ids if not 0 <= t < vocab_size]
    return bad, ", ".join(map(shown_number, bad[:5]))


def _long_integer_index(value: Any, seen: Optional[set] = None) -> str:
    """" at [3]" (" at [0]['k']"): the indexes of the first int in the lists, tuples and dicts of
    ``value`` (their values; depth first, each container once) with more digits than Python
    writes, so a message naming ``value`` by its type says which item it cannot show; "" where no
    index reaches one (a set's item, a dict's key, another container's)."""
    seen = set() if seen is None else seen
    seen.add(id(value))
    items = dict.items(value) if isinstance(value, dict) else enumerate(value) if isinstance(
        value, (list, tuple)) else ()
    for key, item in items:
        if isinstance(item, int) and not isinstance(item, bool) and digits_over_limit(decimal_digits(item)):
            return f" at [{shown_number(key)}]"  # (a dict's key may be such an int too)
        if isinstance(item, (list, tuple, dict)) and id(item) not in seen:
            inner = _long_integer_index(item, seen)
            if inner:
                return f" at [{shown_number(key)}]{inner.removeprefix(' at ')}"
    return ""


def shown_integer_text(text: str) -> str:
    """The decimal integer written ``text`` (a sign, digits, ``_`` between them: a JSON, Python
    or command-line literal) as ``shown_number`` shows its value, worked out from the text alone:
    Python refuses to read one of over 4300 digits (``int()``, ``json.loads``, a literal in code:
    ``digits_over_limit``), and such a literal is what this names (``1.000e+5000 (an integer of
    5001 digits)``). Leading zeros, which Python counts against its limit too, are no digits of
    the value: one they make too long is its value and their number (``7 (written with 5000
    leading zeros)``)."""
    written = text.strip()
    sign, all_digits = "-" if written.startswith("-") else "", written.lstrip("+-").replace("_", "")
    digits = all_digits.lstrip("0") or "0"
    if len(digits) <= SHOWN_CHARS:
        zeros = len(all_digits) - len(digits)
        note = f" (written with {zeros} leading zeros)" if digits_over_limit(len(all_digits)) else ""
        return shown_number(int(sign + digits)) + note  # (int() of the whole text refused it)
    return _scientific(bool(sign), int(digits[:5]), len(digits))


def integer_text_value(text: str) -> Optional[int]:
    """The value of the decimal integer written ``text`` (as ``int()`` reads one: a sign, digits,
    ``_`` between them, spaces around), None where ``text`` is no such integer or its digits past
    any leading zeros are more than Python reads (``digits_over_limit``). Leading zeros are no
    digits of the value: ``int()`` counts them against its limit, so 5000 zeros and a 7 is 7 here
    where ``int()`` refuses it."""
    if not _DECIMAL.fullmatch(text):
        return None
    written = text.strip()
    sign, digits = "-" if written.startswith("-") else "", written.lstrip("+-").replace("_", "").lstrip("0") or "0"
    return None if digits_over_limit(len(digits)) else int(sign + digits)


def _scientific(negative: bool, first: int, digits: int) -> str:
    """An integer of ``digits`` digits whose first five are ``first``, in scientific form with its
    digit count: its first four digits, rounded half up by the fifth, except never up to 10.00, so
    that the exponent is always the digit count less one: 10**4300 - 1 (4300 nines) is
    9.999e+4299, where rounding carried into the exponent (1.000e+4300, a number of 4301 digits,
    beside "an integer of 4300 digits"). The first digits alone decide it, so that an int and its
    text agree."""
    mantissa = str(min((first + 5) // 10, 9999))
    return f"{'-' * negative}{mantissa[0]}.{mantissa[1:]}e+{digits - 1} (an integer of {digits} digits)"


# a decimal integer, as int() reads one: the spaces around it are re's \s but U+001C..U+001F,
# which str.isspace() counts and int() does not strip (it strips ASCII's six and Unicode's others)
_DECIMAL = re.compile(r"[^\S\x1c-\x1f]*[-+]?\d+(_\d+)*[^\S\x1c-\x1f]*")


def too_many_digits(text: str) -> bool:
    """Whether ``text`` is a decimal integer (as ``shown_integer_text`` reads one) that Python
    refuses to read for its length alone (``digits_over_limit`` of its digit characters)."""
    return bool(_DECIMAL.fullmatch(text)) and digits_over_limit(sum(c.isdigit() for c in text))


def past_digit_limit(reader: str = "Python", verb: str = "reads") -> str:
    """What is wrong with a ``too_many_digits`` integer, for a message to put after it; ``reader``
    is who cannot read it (``lmnb serve``, to its client); ``verb`` "writes" for an int
    (``digits_over_limit``) that a message or a request body cannot write."""
    return f"more digits than {reader} {verb} as an integer (at most {sys.get_int_max_str_digits()})"


class _LongInteger:
    """An integer literal of a JSON document with more digits than Python reads (``text``)."""

    def __init__(self, text: str):
        self.text = text


def long_integer_in_json(document: str | bytes) -> Optional[tuple[tuple, str]]:
    """Where the JSON ``document`` holds its first integer literal of more digits than Python reads
    (json.loads' ValueError "Exceeds the limit (4300 digits) ..." names neither): the keys and list
    indices down to it and its text (as ``shown_integer_text`` shows it), or None. It reads the
    document again with a ``parse_int``, which slows every document of numbers: call it only once
    ``json.loads`` refused one with a ValueError other than JSONDecodeError.

    Raises:
        As ``json.loads`` (RecursionError: arrays nested too deep)."""
    def read(text: str) -> Any:  # (json.loads' parse_int: a literal's digits, a minus sign before them)
        return _LongInteger(text) if digits_over_limit(len(text.lstrip("-"))) else int(text)

    def find(value: Any) -> Optional[tuple[tuple, str]]:
        if isinstance(value, _LongInteger):
            return (), value.text
        items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
        for key, item in items:
            found = find(item)
            if found is not None:
                return (key, *found[0]), found[1]
        return None

    return find(json.loads(document, parse_int=read))


class SamplingParamsError(ValueError):
    """A ``SamplingParams`` field is invalid: ``field`` names it, so that a front end names its own
    field for it (an HTTP error's ``param``); ``value`` is its value, which the message shows as
    Python writes it (a JSON front end writes it as JSON)."""

    def __init__(self, message: str, field: str, value: Any = None):
        super().__init__(message)
        self.field = field
        self.value = value


DOES_NOT_FIT = "does_not_fit"
"""The ``reason`` of the engine's refusal of a request whose prompt fits but whose prompt plus
``max_new_tokens`` does not (the model's context length, the KV pool), so that fewer new tokens
would make it fit, and of a prompt past the context whose fix names ``max_new_tokens`` too
(``past_context_refusal``: lower it and shorten the prompt by less, or lower it as well): an
attribute of its ``ValueError`` (``does_not_fit``), and ``lmnb serve``'s
JSON error's ``"reason"`` (an lmnb extension of OpenAI's error object). A front end that chose
the request's ``max_new_tokens`` for its caller (a gen without its own ``max_tokens`` takes the
run's default) reads it, not the message, to say where that number came from."""


def does_not_fit(e: BaseException) -> BaseException:
    """``e`` with its ``reason`` set to ``DOES_NOT_FIT`` (an attribute, kept by pickling)."""
    e.reason = DOES_NOT_FIT
    return e


def past_context_refusal(said: str, max_new_tokens: Any, context_len: int, noun: str = "prompt",
                         field: str = "max_new_tokens", template_tokens: int = 1,
                         prompt_len: Optional[int] = None) -> tuple[str, Optional[str]]:
    """The refusal of a prompt longer than the context, ``said`` ("prompt of 600 tokens exceeds
    the model's context length of 512 tokens"), with its fix: shorten the ``noun``, by how much
    where it was counted (``prompt_len`` tokens, or a lower bound on them: ``shorten_fix``, so
    that it fits beside its ``max_new_tokens``, which the shortened prompt else met as a second
    refusal); and, in the same message, lower ``max_new_tokens`` (the request's ``field``) where
    it leaves no room for the shortest prompt (``template_tokens`` long: one token, or a chat
    template's own tokens). A ``max_new_tokens`` that is no positive integer is left to its own
    check. Returns the message and its ``reason``: ``DOES_NOT_FIT`` where the fix names
    ``field`` (a front end that chose ``max_new_tokens`` says where that number came from), else None."""
    if not isinstance(max_new_tokens, int) or max_new_tokens + template_tokens <= context_len:
        if prompt_len is None or not isinstance(max_new_tokens, int):
            return f"{said}; shorten the {noun}", None
        # (names field where it offers to lower it: more than 1 new token)
        fix = shorten_fix(prompt_len - context_len, max_new_tokens, noun, field)
        return f"{said}; {fix}", DOES_NOT_FIT if max_new_tokens > 1 else None
    room = "any prompt" if template_tokens <= 1 else f"the {noun} (the chat template alone takes {template_tokens} tokens)"
    return (f"{said}, and {field}={shown_number(max_new_tokens)} leaves no room for {room}; "
            f"{both_fix(context_len, noun, field)}", DOES_NOT_FIT)


def shorten_fix(excess: int, max_new_tokens: int, noun: str = "prompt", field: str = "max_new_tokens",
                alone: bool = True) -> str:
    """The fix of a prompt (the request's ``noun``) ``excess`` tokens longer than the most that
    leaves room for no new token (0: one that fills the context), beside ``max_new_tokens`` (the
    request's ``field``): shorten it by ``excess + max_new_tokens`` tokens, said with the rule
    where ``max_new_tokens`` is more than 1, since lowering it shortens the prompt by less but never
    makes it fit alone: "shorten the prompt by at least 88 + max_new_tokens tokens (108 with
    max_new_tokens=20)" (it said that, then "or lower max_new_tokens to N and shorten the prompt by
    at least 88 + N tokens", the same fix twice). ``alone`` False: that shortening leaves no
    prompt (a ``max_new_tokens`` that fits beside none), so ``max_new_tokens`` must be lowered:
    "lower max_new_tokens to N and shorten the prompt by at least 88 + N tokens"."""
    if not alone:
        return f"lower {field} to N and shorten the {noun} by at least {f'{excess} + N' if excess else 'N'} tokens"
    over = excess + max_new_tokens
    if max_new_tokens <= 1:
        return f"shorten the {noun} by at least {over} token{'s' * (over != 1)}"
    rule = f"{excess} + {field}" if excess else field
    return f"shorten the {noun} by at least {rule} tokens ({over} with {field}={shown_number(max_new_tokens)})"


def both_fix(context_len: int, noun: str = "prompt", field: str = "max_new_tokens") -> str:
    """The fix of a prompt and a ``max_new_tokens`` (the request's ``field``) that both must
    shrink to fit ``context_len`` tokens together (neither alone is enough)."""
    return f"shorten the {noun} and lower {field}, so that the prompt's tokens and {field} together fit {context_len}"


def _is_numpy_scalar(v: Any) -> bool:
    return type(v).__module__ == "numpy" and getattr(v, "ndim", None) == 0 and hasattr(v, "item")


def python_value(v: Any, memo: dict | None = None) -> Any:
    """``v`` with numpy scalars (``np.int64(3)``, ``np.float32(0.5)``, ``np.bool_(True)``, from an
    array or a comparison) as the Python values they hold, and a numpy array as the list of them
    (``np.array([7, 9])``, token ids, is ``[7, 9]``), at any depth of lists, tuples and dicts (a
    ``json_schema``'s ``"maximum": np.int64(5)``): a new list (for a tuple too) or dict where one
    was changed; anything else, and a container holding none, as it is. Checks then read one
    type, and the value goes into JSON. A container met again (``memo``, by identity) is read once:
    a schema holding one object at both places of each of 30 levels has 2**30 paths.

    Raises:
        RecursionError: nesting deeper than Python's recursion limit."""
    if _is_numpy_scalar(v):
        return v.item()
    if type(v).__module__ == "numpy" and hasattr(v, "tolist"):  # an ndarray (its items as Python values)
        return v.tolist()
    if not isinstance(v, (list, tuple, dict)):
        return v
    memo = {} if memo is None else memo
    if id(v) not in memo:
        if isinstance(v, dict):
            values = {k: python_value(x, memo) for k, x in v.items()}
            memo[id(v)] = values if any(values[k] is not x for k, x in v.items()) else v
        else:
            items = [python_value(x, memo) for x in v]
            memo[id(v)] = items if any(a is not b for a, b in zip(items, v)) else v
    return memo[id(v)]


def _naming_unknown_fields(cls):
    """Class decorator for a dataclass: its ``__init__``, wrapped (its signature stays the
    dataclass's), refuses the keywords that are no field naming each, the fields there are and the
    field each meant (``suggest.did_you_mean``, as ``gen()`` ends its refusal), where Python said
    only "unexpected keyword argument 'max_tokens'"."""
    init = cls.__init__

    @functools.wraps(init)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        unknown = [k for k in kwargs if k not in cls.__dataclass_fields__]
        if unknown:
            names = [f.name for f in fields(cls)]
            # (the likeliest: OpenAI's name; SGLang's, as here, is max_new_tokens)
            openai = " (OpenAI's max_tokens is max_new_tokens here, as in SGLang)" if "max_tokens" in unknown else ""
            raise TypeError(f"{cls.__name__}() got {unexpected_keywords(unknown)}; its fields: {', '.join(names)}"
                            f"{did_you_mean(unknown, ('', names))}{openai}")
        init(self, *args, **kwargs)

    cls.__init__ = __init__
    return cls


@_naming_unknown_fields
@dataclass
class SamplingParams:
    """How to sample the continuation of one prompt.

    Attributes:
        max_new_tokens: upper bound on generated tokens (int >= 0; 0 = prefill only, which caches
            the prompt and returns no tokens — the frontend's fork hint, paper §3).
        min_new_tokens: EOS and stop token ids are masked until this many tokens exist; ``stop``
            and ``stop_regex`` are checked from the token that makes this many on: a match that
            ends in the earlier tokens' text is let through, one that ends later is a stop even
            where it began there (as a check of the text's tail, SGLang's, finds it;
            ``StopStringMatcher.find``), and so is one ending there that the earlier text did not
            hold (a lookahead reading the later text: ``a|abb|ab(?=bc)`` after "abb", then "c"). With a
            ``regex`` / ``json_schema`` that then allows only those tokens (a first token: refused
            at submission), or is complete (nothing but EOS can follow) before this many tokens,
            the request ends with an abort whose ``FinishReason.field`` is ``min_new_tokens``.
        temperature: 0 means greedy (argmax); otherwise logits are divided by it. Below
            ``SAMPLING_EPS`` it is greedy too, as in SGLang: dividing by it would overflow.
        top_p, top_k, min_p: nucleus / top-k (-1 = off) / min-p filtering, applied after temperature.
        frequency_penalty, presence_penalty: OpenAI-style additive penalties over generated tokens.
        repetition_penalty: CTRL-style multiplicative penalty over prompt + generated tokens, in
            (0, 2] as in SGLang (1 = off).
        stop: string or list of strings; matched on the detokenized output (also across token
            boundaries); the matched stop text is not returned. Where one token completes several
            stops, the match that ends first wins, and among those ending at one character the
            first listed, stop strings before ``stop_regex`` (``StopStringMatcher.find``: SGLang's
            result wherever its own does not depend on how the text was tokenized). At most
            ``MAX_STOP_STRINGS`` strings of ``MAX_STOP_CHARS`` characters in all, none of them empty.
            A stop string that is the whole text of a special token, which ``skip_special_tokens``
            leaves out of the output, also ends the output when that token is sampled (``matched``
            is the stop string); one holding such a token's text among other text is read in the
            output text with those tokens' text put back, the text returned ending where it begins
            (``lmnb_engine.stop_special``).
        stop_token_ids: extra token ids that end generation (the token is not returned as text).
        stop_regex: a regular expression (the ``regex`` package's syntax: Python ``re``'s, plus
            ``\\p{L}``, POSIX classes ...) or a list of them; the output ends
            at the first match in the detokenized text, which is not returned (SGLang's
            ``stop_regex``; the finish reason's ``matched`` is the matched text). A match counts
            as soon as the text so far holds it, as in SGLang's check, but one that reads the end
            of the text so far (``foo\\b``, ``\\.$``, a negative lookahead) only once what follows
            settles it, or where the output ends there (an EOS or stop token finish then becomes
            a stop: ``StopStringMatcher.find``'s ``at_end``; not a max tokens cut, whose end is
            the cut's: the finish reason stays ``length``, the text whole). A match that two ways
            settle only together (``a(?:\\B|(?!\\w))`` after "a": ``\\B`` holds where a word
            character comes, ``(?!\\w)`` where any other does) is met at once, as
            ``tests/stop_regex_reference.py``, which tries every continuation, meets it, where the
            pattern (``a+(?:\\B|(?!\\w))`` too) names only ASCII characters and the classes
            (``stop_together.together``); another such match is
            met once text comes that settles one of the ways (a character late), or where the
            output ends. Streaming holds back text
            that could still become the start of a match (for a pattern with a lookbehind after its
            start, ``a.*?(?<!a)``, whose match starts the ``regex`` package's partial search may miss,
            from where the pattern with those lookbehinds left out may match, a larger language; with
            an atomic group, possessive repeat, backtracking verb, group call, fuzzy constraint or
            inline flag after its start, where leaving them out may match less, all text from the
            last characters its length bounds, where it is bounded, else from where the pattern
            without its assertions may match, else from the output's start). A pattern of characters, classes,
            groups, alternation and repeats only, of at most ``stop_automaton.MAX_POSITIONS``
            characters with its repeats written out (no anchors, word boundaries, lookarounds,
            backreferences, ``\\p{L}`` ...: ``stop_automaton``), is read by an automaton, at a cost
            per token that does not grow with the output; the others are searched
            again each token from where a match may still begin, which for a pattern whose
            matching at a start reads a bounded number of characters (no ``*``, ``+``, ``{n,}``
            or backreference: ``regex_reach``) is among the text's last few and otherwise may be
            an open match's start (``\\bBEGIN[\\s\\S]*?END``: linear in its length; but the search
            for a match is skipped while the pattern with its assertions left out (a lookahead
            that ends it read as its text consumed), read by an automaton where it can be, matches
            nowhere in the text), each search for up to ``stop_matcher.REGEX_TIMEOUT_S`` seconds: one
            that backtracks catastrophically runs past that, and its request is aborted with a
            message naming the pattern. At most ``MAX_STOP_REGEXES`` patterns; ``\\G`` (where a search
            starts, which is where a match may still begin here) is refused: ``\\A`` is the output's start.
        ignore_eos: keep generating past EOS (the model's EOS ids only: explicit ``stop_token_ids`` and
            ``stop`` strings still end the output, as in vLLM; SGLang ignores ``stop_token_ids`` too).
            Not for a constrained request (``regex``, ``json_schema``), by design: its grammar allows
            EOS only where the text so far fully matches, and an EOS sampled there still ends the
            output (finish reason ``stop``, ``matched`` the EOS id), as does a full match that
            nothing can extend (``lmnb_engine.constrained``).
        skip_special_tokens: drop special tokens (the tokenizer's: EOS, chat markers such as
            ``<|user|>``) from the returned text, as SGLang and vLLM do by default; under
            ``ignore_eos`` too, so an output run on through ``</s><|user|>`` reads without them
            (``token_ids`` hold them). False keeps them in the text.
        seed: per-request seed; the same seed and prompt give the same sample.
        n: number of samples sharing one prefill of the prompt (at most ``MAX_N``).
        return_logprob: return the logprob of each generated token.
        top_logprobs_num: also return this many top alternatives per position (at most
            ``MAX_TOP_LOGPROBS``); only with ``return_logprob`` (refused without it).
        logprob_start_len: return prompt logprobs for prompt tokens from this index on (-1 = none).
        regex, json_schema: constrained decoding (see ``lmnb_engine.constrained``); at most one.
        extra: ``{"whitespace_pattern": regex}``, the whitespace a ``json_schema`` output may have
            between JSON tokens (``lmnb_engine.constrained``); no other keys.
        logit_bias: ``{token id: bias}``, added to that token's logit at every output token
            (OpenAI's ``logit_bias``; SGLang's, which adds it as a dense vector): after the
            penalties, before the ``min_new_tokens`` and grammar masks (a masked token stays
            masked: -inf plus a bias is -inf), the greedy argmax and temperature / top_k / top_p /
            min_p. A bias is a number in [-100, 100] (``MAX_LOGIT_BIAS``, OpenAI's range: -100
            bans a token in effect, +100 forces it); a key is an int, or its decimal text as
            OpenAI's API and SGLang's JSON send it (``validate`` makes it an int); the engine
            refuses ids outside its vocabulary. Returned logprobs stay the model's own, before the
            bias, as they are before the penalties and temperature (``lmnb_engine.sampler``).
    """

    max_new_tokens: int = 128
    min_new_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    seed: int | None = None
    n: int = 1
    return_logprob: bool = False
    top_logprobs_num: int = 0
    logprob_start_len: int = -1
    regex: str | None = None
    json_schema: str | dict | bool | None = None
    stop_regex: str | list[str] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    logit_bias: dict[int, float] | None = None

    @property
    def stop_strings(self) -> list[str]:
        """``stop`` as a list."""
        return as_list(self.stop)

    @property
    def stop_regexes(self) -> list[str]:
        """``stop_regex`` as a list."""
        return as_list(self.stop_regex)

    @property
    def constraint(self) -> Optional[str]:
        """The field that constrains the output: ``"regex"``, else ``"json_schema"`` where one is
        set, else None (the field a grammar's error or abort is about)."""
        return "regex" if self.regex is not None else "json_schema" if self.json_schema is not None else None

    @property
    def greedy(self) -> bool:
        """Whether sampling is argmax: temperature (near) 0 or ``top_k == 1``."""
        return self.temperature < SAMPLING_EPS or self.top_k == 1

    def copy(self, **changes: Any) -> "SamplingParams":
        """A copy with the fields in ``changes`` replaced."""
        return replace(self, **changes)

    def validate(self) -> None:
        """Check every field; raise ``SamplingParamsError`` (a ``ValueError``) naming the field, the
        value and the allowed range."""

        for f in fields(self):
            try:
                setattr(self, f.name, python_value(getattr(self, f.name)))
            except RecursionError:  # (python_value recurses per level; no value is shown: repr would recurse too)
                rule = TOO_DEEP if f.name == "json_schema" else "nests too deeply to read; flatten it"
                raise SamplingParamsError(f"SamplingParams.{f.name} is invalid: {rule}", f.name) from None

        def bad(name: str, rule: str, show: bool = True, as_json: bool = False) -> None:
            value = getattr(self, name)  # (not shown: thousands of stops, say)
            shown = "" if not show else f"={json_value(value, SHOWN_CHARS)}" if as_json else f"={shown_number(value)}"
            raise SamplingParamsError(f"SamplingParams.{name}{shown} is invalid: {rule}", name, value)

        def is_int(v: Any) -> bool:
            return isinstance(v, int) and not isinstance(v, bool)

        if not is_int(self.max_new_tokens) or self.max_new_tokens < 0:
            bad("max_new_tokens", "must be an integer >= 0")
        if not is_int(self.min_new_tokens) or not 0 <= self.min_new_tokens:
            bad("min_new_tokens", "must be an integer >= 0")
        if self.min_new_tokens > self.max_new_tokens:
            bad("min_new_tokens", f"must not exceed max_new_tokens={shown_number(self.max_new_tokens)}")
        if not finite_number(self.temperature) or self.temperature < 0:
            bad("temperature", TEMPERATURE_RULE)
        if not finite_number(self.top_p) or not 0 < self.top_p <= 1:
            bad("top_p", "must be in (0, 1]")
        if not is_int(self.top_k) or (self.top_k < 1 and self.top_k != -1):
            bad("top_k", "must be -1 (off) or an integer >= 1")
        if not finite_number(self.min_p) or not 0 <= self.min_p <= 1:
            bad("min_p", "must be in [0, 1]")
        for name in ("frequency_penalty", "presence_penalty"):
            v = getattr(self, name)
            if not finite_number(v) or not -2 <= v <= 2:
                bad(name, "must be in [-2, 2]")
        # SGLang's range (vLLM takes any finite value > 0); the sampler keeps even 1e-300 finite
        if not finite_number(self.repetition_penalty) or not 0 < self.repetition_penalty <= 2:
            bad("repetition_penalty", "must be in (0, 2] (1 = off, above 1 discourages repeats, below 1 favours them)")
        if self.stop is not None and not (
            isinstance(self.stop, str)
            or (isinstance(self.stop, (list, tuple)) and all(isinstance(s, str) for s in self.stop))
        ):
            bad("stop", "must be a string or a list of strings")
        problem = stop_problem(self.stop)
        if problem:
            bad("stop", problem, show=False)
        problem = stop_regex_problem(self.stop_regex)
        if problem:
            bad("stop_regex", problem, show=not isinstance(self.stop_regex, (list, tuple))
                or len(self.stop_regex) <= MAX_STOP_REGEXES, as_json=True)  # (as the regex errors show a pattern)
        if self.stop_token_ids is not None and not (
            isinstance(self.stop_token_ids, (list, tuple))
            and all(is_int(t) and t >= 0 for t in self.stop_token_ids)
        ):
            bad("stop_token_ids", "must be a list of non-negative token ids")
        for name in ("ignore_eos", "skip_special_tokens", "return_logprob"):
            if not isinstance(getattr(self, name), bool):
                bad(name, "must be true or false")
        if self.seed is not None and not (is_int(self.seed) and -(2**63) <= self.seed < 2**63):
            bad("seed", "must be None or an integer that fits in 64 bits (-2**63 <= seed < 2**63)")
        if not is_int(self.n) or self.n < 1:
            bad("n", "must be an integer >= 1")
        if self.n > MAX_N:
            bad("n", f"at most {MAX_N} samples per request; send several requests for more")
        if not is_int(self.top_logprobs_num) or not 0 <= self.top_logprobs_num <= MAX_TOP_LOGPROBS:
            bad("top_logprobs_num", f"must be an integer from 0 to {MAX_TOP_LOGPROBS} (top alternatives per token)")
        if self.top_logprobs_num and self.return_logprob is False:
            # SGLang drops it without a word, and the caller got no alternatives and no reason; the
            # OpenAI routes refuse top_logprobs without logprobs, as OpenAI does
            bad("top_logprobs_num", TOP_LOGPROBS_RULE)
        if not is_int(self.logprob_start_len) or self.logprob_start_len < -1:
            bad("logprob_start_len", "must be -1 (no prompt logprobs) or an index >= 0")
        if self.regex is not None and self.json_schema is not None:
            bad("regex", "set at most one of regex and json_schema")
        if self.regex is not None and not isinstance(self.regex, str):
            bad("regex", "must be a string")
        if not isinstance(self.extra, dict) or set(self.extra) - {"whitespace_pattern"}:
            bad("extra", "must be a dict whose only key is 'whitespace_pattern' (a regex string)")
        if not isinstance(self.extra.get("whitespace_pattern", ""), (str, type(None))):
            bad("extra", "whitespace_pattern must be a regex string")
        if self.logit_bias is not None:
            self.logit_bias = logit_bias_value(self.logit_bias)


def logit_bias_value(bias: Any) -> dict[int, float]:
    """``bias`` (a ``logit_bias``: a dict of token ids, or their decimal text, to numbers) as
    ``{int id: float bias}``. The vocabulary's bound is the engine's to check (``Engine``).

    Raises:
        SamplingParamsError: ``bias`` is no dict, a key is no token id (a bool, a negative int, a
            text of no integer) or is one of more digits than Python reads, as an int or as its text
            (past every vocabulary), or a bias is no finite number in [-100, 100]; the message names the key
            and the fix."""
    def bad(rule: str, entry: Any = None) -> None:
        raise SamplingParamsError(f"SamplingParams.logit_bias is invalid: {rule}", "logit_bias", entry)

    if not isinstance(bias, dict):
        bad(f"must be a dict mapping token ids to biases, e.g. {{1234: -100}}; got a {type(bias).__name__}")
    out: dict[int, float] = {}
    keys: dict[int, Any] = {}  # (each id's key as given, which a second key naming it is told apart from)
    for key, value in bias.items():
        token = key.item() if _is_numpy_scalar(key) else key
        written = isinstance(key, str) and _ID_TEXT.fullmatch(key)
        # One refusal for an id of more digits than Python reads, as text or as an int: an int one was
        # told it is outside this model's vocabulary (the engine) or too long to send (a server backend)
        if written:  # (leading zeros are no digits of the id, but int() counts them against its limit)
            token = integer_text_value(key)  # (None: more digits past the zeros than Python reads)
            too_long = token is None and not key.startswith("-")
        else:
            too_long = isinstance(token, int) and token > 0 and digits_over_limit(decimal_digits(token))
        if too_long:
            shown = shown_integer_text(key) if written else shown_number(token)
            bad(f"the key {shown} is a token id past every model's vocabulary; remove it, or take the ids from the "
                "model's tokenizer", {key: value})
        if not isinstance(token, int) or isinstance(token, bool) or token < 0:
            shown = shown_integer_text(key) if written and too_many_digits(key) else shown_number(key)
            # (no backend-neutral encoder exists, nor one over an HTTP API: the fix names where each comes from;
            # said for a key that is text of no number, a word, not for -1, 5.0 or True)
            word = ("; to bias a word, give its token ids from the model's own tokenizer: "
                    "tokenizer.encode(word, add_special_tokens=False), where tokenizer is lmnb.Engine(...).get_tokenizer() "
                    "or lmnb_engine.Engine(...).tokenizer in process, or transformers.AutoTokenizer.from_pretrained(the "
                    "model's path or hub id) for a served model (for OpenAI's own models, "
                    "tiktoken.encoding_for_model(name).encode(word))") if isinstance(key, str) and not written else ""
            bad(f"the key {shown} is not a token id: keys are token ids (ints >= 0, or their decimal text as in "
                f"OpenAI's API, \"1234\"){word}", {key: value})
        if not finite_number(value) or not -MAX_LOGIT_BIAS <= value <= MAX_LOGIT_BIAS:
            what = "is not a number" if not isinstance(value, (int, float)) or isinstance(value, bool) else \
                "is not a finite number" if not finite_number(value) else \
                f"is outside [{-MAX_LOGIT_BIAS:g}, {MAX_LOGIT_BIAS:g}]"
            bad(f"the bias of token {shown_number(token)}, {shown_number(value)}, {what}: give a number from "
                f"{-MAX_LOGIT_BIAS:g} (bans the token in effect) to {MAX_LOGIT_BIAS:g} (forces it in effect)",
                {key: value})
        if token in out:  # (one id written both as an int and as its text, or as "05" and "5")
            first = keys[token]
            bad(f"token {shown_number(token)} is given twice, as the keys {shown_number(first)} and "
                f"{shown_number(key)}; give each token one bias", {first: bias[first], key: value})
        out[token], keys[token] = float(value), key
    return out


def as_list(value: str | list[str] | tuple[str, ...] | None) -> list[str]:
    """A ``stop`` or ``stop_regex`` value (None, a string, or a list of them) as a new list. The
    language's ``GenParams`` reads its own with it too (this module is torch-free)."""
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)


def stop_problem(value: str | list[str] | tuple[str, ...] | None) -> str | None:
    """Why ``value`` (None, a string, or a list of strings) is not a valid ``stop``, or None when
    it is: an empty string (every text holds it, so it names no place to stop: SGLang stopped
    after one token, lmnb ignored it), or the limit it exceeds, ``MAX_STOP_STRINGS`` or
    ``MAX_STOP_CHARS``. The language's ``gen(stop=...)`` and the cell parser ask the same question
    before anything runs."""
    stops = as_list(value)
    if "" in stops:
        where = "" if isinstance(value, str) else f" (item {stops.index('')})"
        return (f"an empty string{where} names no place to stop: every text holds it; remove it (leave stop out "
                "for no stop string)")
    for i, stop in enumerate(stops):  # (the output is text, so it can never hold one)
        problem = lone_surrogate_problem(stop)
        if problem:
            return f"the stop string{'' if isinstance(value, str) else f' (item {i})'} {problem}"
    count, chars = len(stops), sum(map(len, stops))
    fix = ("(each is looked for in the output on every token); keep the stops that can occur, or write them as "
           "one stop_regex")
    if count > MAX_STOP_STRINGS:
        return f"{count} strings, above the limit of {MAX_STOP_STRINGS} strings {fix}"
    if chars > MAX_STOP_CHARS:
        return (f"{count} string{'s' * (count != 1)} of {chars} characters in all, above the limit of "
                f"{MAX_STOP_CHARS} characters {fix}")
    return None


# A fuzzy constraint of the regex package after a part: {e<=1}, {1<=e<=3}, {i<=1,d<=1}, {2i+2d+1s<=4},
# {e<=1:[a-z]} (what a "{" that is no count and no fuzzy constraint opens is a syntax error there,
# "{end}", or literal text, "{ e }")
_FUZZY_ITEM = r"(?:\d+<=?)?[eids](?:<=?\d+)?"
_FUZZY = re.compile(rf"\{{(?:{_FUZZY_ITEM}(?:,{_FUZZY_ITEM})*|\d*[eids](?:\+\d*[eids])*<=?\d+)(?::[^}}]*)?\}}")


def _fuzzy_constraint(pattern: str, verbose: bool = False) -> str | None:
    """The first fuzzy constraint in ``pattern`` (its text), outside escapes, character classes and
    comments (``regex_parts.pattern_parts``); None where it holds none. ``verbose``: whether the
    VERBOSE flag holds for the whole pattern (``(?x)`` anywhere); a scoped ``(?x:`` or ``(?-x:``
    sets it up to its group's ``)``. Where it holds, the regex package reads a constraint with
    whitespace in it, ``{ e <= 1 }``, as one (without the flag that is literal text) and "#"
    starts a comment."""
    for part in pattern_parts(pattern, "x" * verbose):
        braces = [at for at in range(part.start, part.end) if pattern[at] == "{"] if part.kind == "" else []
        for at in braces:
            if m := _FUZZY.match(pattern, at):
                return m.group()
            if "x" in part.flags and (end := pattern.find("}", at)) > 0:
                if _FUZZY.fullmatch(text := re.sub(r"\s", "", pattern[at:end + 1])):
                    return text
    return None


def _escapes(pattern: str, verbose: bool) -> Iterator[str]:
    """The character after the backslash of each escape outside a class of ``pattern`` that the
    regex package reads as syntax (a ``\\G`` or ``\\K`` in a class is an error of its own): not one
    in a comment (``regex_parts.pattern_parts``: ``(?#...)``, which ends at the first ``)`` no
    backslash escapes, or, where the VERBOSE flag holds, from a ``#`` outside a class to the line's
    end, which may hold a ``)``). ``verbose``: whether the flag holds for the whole pattern
    (``(?x)`` anywhere); a scoped ``(?x:`` or ``(?-x:`` sets it up to its group's ``)``. Each
    escape is read with its backslash, so ``\\\\G`` is a backslash and a G."""
    return (pattern[part.start + 1:part.start + 2] for part in pattern_parts(pattern, "x" * verbose)
            if part.kind == "escape")


def stop_regex_problem(value: Any) -> str | None:
    """Why ``value`` is not a valid ``stop_regex``, or None when it is (None, a pattern, or a list of them).

    A pattern must compile in the ``regex`` package (whose partial matching holds streamed text
    back; its error is told in Python's ``re``'s words and place where ``re`` refuses the pattern
    too, as a ``regex`` constraint's is: ``regex_python_error.python_error``) and must not match the
    empty string, which would stop the output early, nor hold ``\\G``, nor a POSIX class
    (``[[:alpha:]]``: ``regex_stop_posix.stop_posix_problem``), which that package and Python's ``re``
    read two ways, nor be a reverse pattern (``(?r)``) nor hold ``\\K``, whose matches the stop
    matcher, reading the output left to right from where a match begins, does not find, nor a class
    that matches no character (``regex_empty_class.empty_class_problem``, worded as for ``regex=``), nor
    an assertion that keeps it from ever matching (``regex_never.never_problem``: ``a\\bb``, ``$a``,
    ``(?!)``), where the output would run to its max tokens unstopped. The
    language's ``gen(stop_regex=...)`` and the cell parser ask the same question before anything runs.
    """
    if value is None:
        return None
    import regex  # (a dependency of transformers, declared by lmnb too)

    if not (isinstance(value, str) or (isinstance(value, (list, tuple)) and all(isinstance(p, str) for p in value))):
        return "must be a regular expression (a string) or a list of them"
    if not isinstance(value, str) and len(value) > MAX_STOP_REGEXES:
        return (f"{len(value)} patterns, above the limit of {MAX_STOP_REGEXES} (each is searched in the output on "
                "every token); join alternatives into one pattern with |")
    for pattern in [value] if isinstance(value, str) else value:
        problem = lone_surrogate_problem(pattern, json_value)  # (the output is text, so it can never match one)
        if problem:  # (a pattern is shown as JSON, as the other errors here show it)
            return problem
        try:
            compiled = regex.compile(pattern)
        except regex.error as e:  # (in re's words and place where re refuses it too, as a regex= error)
            return f"{shown_regex(pattern)} is not a valid regular expression ({python_error(pattern) or e}); fix the pattern"
        # ((?x) anywhere is the whole pattern's flag, read from the compiled pattern)
        escaped = set(_escapes(pattern, bool(compiled.flags & regex.VERBOSE)))
        if "G" in escaped:
            return (f"{shown_regex(pattern)} holds \\G, which matches where a search starts: the output is searched "
                    "from where a stop may still begin, at every start, so it would match there, not at the output's "
                    "start; use \\A for the output's start")
        if compiled.flags & regex.REVERSE:  # ((?r) anywhere, scoped too, is the whole pattern's flag)
            return (f"{shown_regex(pattern)} is a reverse pattern ((?r)), which matches leftwards from where a search "
                    "starts: the stop matcher reads the output as it grows, left to right, and would stop at the "
                    "wrong place or show the stop's text; remove (?r) and write the pattern to match forwards")
        fuzzy = _fuzzy_constraint(pattern, bool(compiled.flags & regex.VERBOSE))
        if fuzzy:
            return (f"{shown_regex(pattern)} holds the fuzzy constraint {fuzzy}, whose match the regex package picks "
                    "by its own best-match rule, not leftmost as the text grows: the stop matcher would show part of "
                    "such a stop or miss it; write the variants out as alternatives (colou?r, not (?:color){e<=1})")
        if "K" in escaped:
            return (f"{shown_regex(pattern)} holds \\K, which drops what it matched before it from the match: the "
                    "stop matcher looks for where a stop may begin from its whole match, so it would miss stops "
                    "and show their text; put the part before \\K in a lookbehind, (?<=...), instead")
        if compiled.search("") is not None:
            anchored = _anchors_only(pattern)
            if anchored is not None:
                return f"{shown_regex(pattern)} {anchored}; remove it, or make it match at least one character"
            return (f"{shown_regex(pattern)} matches the empty string, so it would stop the output early, where "
                    "an empty match is met, not where what it looks for is written; make it match at least one character")
        # (after the checks above, so that the readings this offers are not refused by them in turn:
        # [[:alpha:]]* was offered [A-Za-z]*, which matches the empty string)
        problem = stop_posix_problem(pattern) or empty_class_problem(pattern, stop=True) or never_problem(pattern)
        if problem:
            return problem
    return None


def _anchors_only(pattern: str) -> str | None:
    """What a stop ``pattern`` made of the output's start and end anchors alone (``^``, ``\\A``,
    ``$``, ``\\Z``, ``^$``, outside multiline mode) would do, as the stop matcher reads it: its
    empty match at the start is never met (the output is checked after each token), at the end it
    cuts nothing (``$`` also matches before a final line break, which it would cut). None for any
    other pattern, or one Python's parser does not read as the ``regex`` package does."""
    from lmnb_engine.regex_reach import Unreadable, parse_as_python
    from lmnb_engine.regex_tree import walk

    try:
        parsed = parse_as_python(pattern)
    except Unreadable:
        return None
    nodes = list(walk(parsed))
    if parsed.state.flags & re.MULTILINE or any(op.name == "SUBPATTERN" and av[1] & re.MULTILINE for op, av in nodes):
        return None  # (^ and $ then match at each line's start and end, inside the output)
    anchors = {av.name for op, av in nodes if op.name == "AT"}
    if not anchors or any(op.name not in ("AT", "BRANCH", "SUBPATTERN") for op, _ in nodes) or \
            not anchors <= {"AT_BEGINNING", "AT_BEGINNING_STRING", "AT_END", "AT_END_STRING"}:
        return None
    start = anchors & {"AT_BEGINNING", "AT_BEGINNING_STRING"}
    if anchors == start:
        return ("matches only the empty string at the output's start, where no stop is looked for (the output is "
                "checked after each token), so it would stop nothing")
    cut = " but a final line break, before which $ matches too" if "AT_END" in anchors else ""
    return f"matches only the empty string at the output's {'start or ' * bool(start)}end, so it would cut nothing{cut}"


def in_front_end_names(message: str, names: dict[str, str]) -> str:
    """An engine or ``SamplingParams`` error ``message`` in a front end's own field names
    (``names``: engine field -> the front end's), so that a user told to "lower max_new_tokens"
    is told the field they wrote: the OpenAI routes' ``max_tokens``, the language's
    ``gen(max_tokens=...)``."""
    message = message.replace("SamplingParams.", "")
    for field_name, name in names.items():
        message = re.sub(rf"\b{field_name}\b", name, message)
    return message
