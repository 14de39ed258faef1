"""The word every "did you mean" of lmnb and lmnb_engine offers for a misspelt one.

Standard library only, so that every front end (the Python API, cells, command lines, the server)
can import it without loading the engine.
"""

from __future__ import annotations

import difflib
from typing import Any, Iterable, Optional, Sequence


# Peers' names for a stop string (HF generate's stop_strings, Anthropic's stop_sequences, text-generation-webui's
# stopping_strings ...), which lmnb, as OpenAI and SGLang, calls ``stop``: difflib offered them ``stop_regex`` (or
# ``stop_token_ids``), whose meaning differs (stop_regex=["."] stops at any character). HF generate's
# num_return_sequences is OpenAI's and SGLang's ``n``, which difflib finds no closer than any short name.
PEER_NAMES = {**{name: "stop" for name in (
    "stop_str", "stop_strs", "stop_string", "stop_strings", "stop_sequence", "stop_sequences", "stop_word",
    "stop_words", "stopping_strings")}, "num_return_sequences": "n"}


def close_match(word: str, options: Iterable[str]) -> Optional[str]:
    """The one of ``options`` closest to a misspelt ``word``, or None where none is close: a peer's
    name for one of them (``PEER_NAMES``, ``-`` read as ``_``: ``stop_strings`` → ``stop``), else
    difflib's ``get_close_matches`` (a similarity ratio of 0.6 or more, as Python's own "Did you
    mean" picks), or else the first option one slip away (``_one_edit``) from a word of two
    characters or more, letter case aside (``RUN`` → ``run``, which difflib found no closer than ``xyz``;
    of options that differ in case only, the first listed): a ``%%lm`` cell's variable, the Python
    API's keywords, ``%lm`` subcommands, the export's notes on row fields, command-line options and
    choices (``cli_options.suggest_option``), ``SamplingParams`` fields, the server's fields and
    routes, ECMA property names (``regex_properties``)."""
    options = list(options)
    if word in options:
        return word
    peer = PEER_NAMES.get(word.replace("-", "_"))
    if peer in options:
        return peer
    folded: dict[str, str] = {}
    for option in options:
        folded.setdefault(option.lower(), option)
    close = difflib.get_close_matches(word.lower(), list(folded), n=1)
    if not close and len(word) >= 2:  # (a lone letter is one edit from every other: no offer)
        close = [option for option in folded if _one_edit(word.lower(), option)][:1]
    return folded[close[0]] if close else None


def _one_edit(a: str, b: str) -> bool:
    """Whether ``b`` is ``a`` with one character inserted, left out, replaced, or two adjacent
    characters swapped (Damerau's four single errors): difflib's ratio misses such a slip in a short
    name, ``nm`` for ``mn`` or ``tk`` for ``tp`` (0.5, below its 0.6)."""
    if a == b or abs(len(a) - len(b)) > 1:
        return False
    if len(a) > len(b):
        a, b = b, a
    i = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), len(a))
    if len(a) < len(b):  # one inserted into a
        return a[i:] == b[i + 1:]
    return a[i + 1:] == b[i + 1:] or (a[i + 2:] == b[i + 2:] and a[i:i + 2] == b[i:i + 2][::-1])


def did_you_mean(words: Sequence[str], *tiers: tuple[str, Any]) -> str:
    """The "; did you mean ...?" ending a refusal of the unknown ``words`` (keywords, options; in
    the order the refusal names them): each word is offered its ``close_match`` in the first of
    ``tiers`` (``(label, names)`` pairs, the label written before the name, e.g. ``"the run option
    "``) that has one. One word: ``; did you mean 'max_tokens'?``; several, each offer after its
    word: ``; did you mean 'max_token' → 'max_tokens', 'temprature' → 'temperature'?`` (as a cell's
    ``%%lm --temprature`` is offered its option); "" where no word has a close name. The Python
    API's refusals of a keyword (``gen()``, a program's run, ``SamplingParams``) end so."""
    offers = []
    for word in words:
        offer = next((f"{label}{match!r}" for label, names in tiers if (match := close_match(word, sorted(names)))),
                     None)
        if offer is not None:
            offers.append(offer if len(words) == 1 else f"{word!r} → {offer}")
    return f"; did you mean {', '.join(offers)}?" if offers else ""


def unexpected_keywords(words: Sequence[str]) -> str:
    """``an unexpected keyword argument 'a'``, or for several ``unexpected keyword arguments 'a',
    'b'`` (Python's ``TypeError`` names only the first of them)."""
    if len(words) == 1:
        return f"an unexpected keyword argument {words[0]!r}"
    return f"unexpected keyword arguments {', '.join(map(repr, words))}"
