"""A brute-force reference for where a stop regex stops the output, written from the semantics
``SamplingParams.stop_regex`` documents and sharing no code with ``lmnb_engine.stop_matcher``.

The output is checked after each character. After ``k`` characters a match of the pattern is a
(start, end) span over which the ``regex`` package matches it, its assertions reading all of
``text[:k]`` (and no more: the text's end is where the output so far ends). Such a match is met
once no text that may follow can undo it: it is still a match of ``text[:k] + more`` for every
``more`` of up to ``ahead`` characters of ``alphabet`` (the patterns this is used with read at
most that far past a match). The stop is met at the first ``k`` where some match is: the
leftmost such match, and from its start the one the ``regex`` package matches in ``text[:k]``
where that one is met, else the shortest met. Where none is met and the output ends with
``text``, the stop is the ``regex`` package's leftmost match in all of ``text`` (a match that
reads the output's end is a stop when the output ends there), or none.

Slow by design (every span, every continuation): for texts of a few characters only.
"""

from __future__ import annotations

import functools
import itertools


@functools.lru_cache(maxsize=8192)
def _matching_exactly(pattern: str, after: int):
    """``pattern`` compiled so that a match must end where exactly ``after`` characters follow,
    which its assertions still read (a lookahead for them, after the pattern)."""
    import regex

    compiled = regex.compile(pattern)
    flags = regex.match(r"(?:\(\?[a-zA-Z]+\))*", pattern).group()  # (global flags stay first)
    newline = "\n" if compiled.flags & regex.VERBOSE else ""  # (a verbose "#" comment ends there)
    return regex.compile(f"{flags}(?:{pattern[len(flags):]}{newline})(?=[\\s\\S]{{{after}}}\\Z)")


def matches(pattern: str, text: str) -> set[tuple[int, int]]:
    """Every (start, end) over which ``pattern`` matches in ``text``, reading all of it."""
    return {(s, e) for s in range(len(text) + 1) for e in range(s, len(text) + 1)
            if _matching_exactly(pattern, len(text) - e).match(text, s) is not None}


@functools.lru_cache(maxsize=16)
def _continuations(alphabet: str, ahead: int) -> tuple[str, ...]:
    return tuple("".join(t) for n in range(1, ahead + 1) for t in itertools.product(alphabet, repeat=n))


def met(pattern: str, text: str, alphabet: str, ahead: int) -> set[tuple[int, int]]:
    """The matches in ``text`` that no text of up to ``ahead`` characters of ``alphabet`` after
    it undoes."""
    more = _continuations(alphabet, ahead)
    return {(s, e) for s, e in matches(pattern, text)
            if all(_matching_exactly(pattern, len(text) + len(m) - e).match(text + m, s) is not None for m in more)}


def reference_stop(pattern: str, text: str, ended: bool, alphabet: str, ahead: int = 2) -> tuple[int, str] | None:
    """Where ``pattern`` stops an output of ``text``, checked after each character: (start of the
    stop, matched text), or None (see the module's docstring). ``ended``: the output ends with
    ``text``."""
    import regex

    for k in range(1, len(text) + 1):
        final = met(pattern, text[:k], alphabet, ahead)
        if final:
            start = min(s for s, _ in final)
            m = regex.compile(pattern).match(text[:k], start)
            end = m.end() if m is not None and (start, m.end()) in final else min(e for s, e in final if s == start)
            return start, text[start:end]
    m = regex.search(pattern, text) if ended else None
    return None if m is None else (m.start(), m.group())
