"""How a stop regex is rewritten for the searches of a text that more output may extend.

``relax``: the pattern whose end assertions and negative lookaheads first read past the text's
end, for the partial search of where a match may still begin (``StopRegexes.partial``, read by
``StopStringMatcher.safe_len``) and for the checks of whether a match that may read the text's end
is final (``stop_end_reading``). ``ending_by``: the pattern matching only where a given number of
characters follow its match, for the checks of a match ending before the text's end. Both
``stop_matcher`` and ``stop_end_reading`` import this module, which imports neither; it compiles
patterns and searches none (the search budget, ``stop_matcher.REGEX_TIMEOUT_S``, is not read here).
"""

from __future__ import annotations

import functools
import re
from typing import Any

from lmnb_engine.regex_parts import global_flags

# The name of the empty group that marks where a negative lookahead stood (the lookaheads of relax)
LOOKAHEAD_MARK = "_lmnb_lookahead"


# The relaxed form of each assertion whose value at a position may change once text comes after
# the text's end: it first reads that far ahead (to the end for a word boundary; for "$", which
# also holds before a final newline, one further after a newline, but no further than a character
# that is none, after which it fails whatever comes: "a$" on "ab" is no partial match; erring
# towards holding back, two for "\Z" and "\z"), and a read past the end makes the search partial,
# so the match start is kept.
# (Patterns without an end assertion or a negative lookahead, stop_matcher._END_ASSERTION, are not
# rewritten: StopRegexes.partial.)
_RELAX = {"\\b": r"(?:(?=[\s\S])\b)", "\\B": r"(?:(?=[\s\S])\B)", "\\m": r"(?:(?=[\s\S])\m)",
          "\\M": r"(?:(?=[\s\S])\M)", "\\Z": r"(?:(?=[\s\S]{2})\Z)", "\\z": r"(?:(?=[\s\S]{2})\z)",
          "$": r"(?:(?=\n[\s\S]|[^\n])$)"}
# ... and "^" in multiline mode, whose value at the text's end is known (the character before),
# but where the regex package's partial search drops a start when a lazy repeat before it reaches
# the text's end and it fails there ("(?m)a[\s\S]*?^b" on "xaa": partial at 2, not 1, though
# "xaa\nb" matches from 1; a greedy repeat is kept): read ahead first, the search there is partial
_RELAX_MULTILINE = {**_RELAX, "^": r"(?:(?=[\s\S])^)"}
# A multiline flag, found in a pattern's text erring towards yes ("(?m)", "(?im:", "(?-m)" too)
MULTILINE_FLAG = re.compile(r"\(\?[a-zA-Z-]*m")
# "$" in multiline mode: it holds before any newline, so that newline alone settles it ("(?m)\.$" on
# "Done.\n" is final before "Next" comes), and at the text's end, which one more character undoes
_MULTILINE_END = r"(?:(?=[\s\S])$)"
# A multiline flag turned off in a scope ("(?-m:", "(?i-m)"), where "$" is not multiline
_MULTILINE_OFF = re.compile(r"\(\?[a-zA-Z]*-[a-zA-Z]*m")


def _multiline(pattern: str) -> bool:
    """Whether every "$" of ``pattern`` is in multiline mode: the flag is set for all of it and
    turned off nowhere (else, or where it does not compile, "$" is relaxed as outside that mode,
    which holds a match back longer: never a stop that more text undoes)."""
    import regex

    try:
        return bool(regex.compile(pattern).flags & regex.MULTILINE) and not _MULTILINE_OFF.search(pattern)
    except regex.error:
        return False


def relax(pattern: str, drop_lookbehinds: bool = False, lookaheads: list[str] | None = None,
          partial: bool = True) -> str | None:
    """``pattern`` for ``StopStringMatcher.safe_len``'s partial search: every end assertion
    (``_RELAX``) first reads past where its value can still change, so a search that reaches it at
    the text's end is partial (the match start kept) or goes on as the pattern does; and a negative
    lookaround ``(?!X)`` is ``(?:(?=X')(?!)|(?!X))``, X' being X relaxed: partial where X's match
    may yet come undone, else ``(?!X)`` (a partial read inside a negative lookaround counts as no
    match, which would decide it). A whole match of the result is one of ``pattern``; a start the
    result drops, ``pattern`` cannot match at in any longer text.
    ``drop_lookbehinds``: every lookbehind but one first in the pattern (after its global flags) is
    left out too, ``(?:)`` in its place (``stop_matcher._LATE_LOOKBEHIND``; the caller has ruled out
    ``stop_matcher._NO_SUPERSET``). A match of ``pattern`` then is one of the result, so a start the
    result drops, ``pattern`` cannot match at in any longer text either: each lookbehind left out is
    an assertion that its match passed, consuming nothing, and none lies in a negative lookaround
    (there one would make the lookaround hold less often: None) nor in a lookahead (None:
    ``stop_matcher._live_start`` passes over a whole match short of the text's end, one the pattern
    may yet make by reading past it). None where this reading of the pattern may be wrong (verbose
    mode in a scope, or global where Python's parser reads the pattern otherwise than the regex
    package, ``_read_alike``; word mode, a conditional, a set inside a set, a capturing group or
    backreference inside a negative lookaround, a capturing group inside a lookbehind left out):
    the caller then shows nothing past where a match may begin. ``lookaheads``: where given, each
    negative lookahead's X' is added to it, and in the result the lookahead is followed by an
    empty group named ``LOOKAHEAD_MARK`` and its index there, which marks where it stood in a match
    (None where the pattern refers to a group by number, which that would renumber). ``partial``
    False: for a search that is not partial (``stop_end_reading.windowed``), where ``(?=X')(?!)``
    never matches: a negative lookaround is left as it is."""
    flags = global_flags(pattern)
    lead = len(flags)
    # word or version flags, a conditional, a verbose flag not global (in a scope "#" and spaces
    # read otherwise than outside it)
    if re.search(r"\(\?[a-zA-Z0-9-]*[wV]|\(\?\(", pattern) or re.search(r"\(\?[a-zA-Z0-9-]*x", pattern[lead:]):
        return None
    verbose = "x" in flags
    if verbose and not _read_alike(pattern):
        return None  # (a group head with spaces in it, "(? !a)", is one to the regex package only)
    if lookaheads is not None and re.search(r"\\[1-9]|\\g<\d|\(\?\|", pattern):
        return None
    forms = _RELAX_MULTILINE if MULTILINE_FLAG.search(pattern) else _RELAX
    if _multiline(pattern):
        forms = {**forms, "$": _MULTILINE_END}
    if lookaheads is not None:  # (\Z and \z hold at the text's end only: one character settles them)
        forms = {**forms, "\\Z": r"(?:(?=[\s\S])\Z)", "\\z": r"(?:(?=[\s\S])\z)"}
    # the groups being read, outermost first: their text so far (relaxed, original), whether the
    # group is a negative lookaround, and whether it is a lookbehind left out
    stack: list[tuple[list[str], list[str], bool, bool]] = [([], [], False, False)]
    i = 0
    while i < len(pattern):
        relaxed, original, _, _ = stack[-1]
        c = pattern[i]
        if c == "\\":
            tok = pattern[i:i + 2]
            if tok[1:] and tok[1] in "123456789gk" and any(neg for _, _, neg, _ in stack):
                return None  # a backreference in a negative lookaround, which is written twice
            relaxed.append(forms.get(tok, tok))
            original.append(tok)
            i += 2
        elif c == "[":  # a set, copied as it is: "$" and "\b" in it are characters
            j = i + 1
            j += pattern[j:j + 1] == "^"
            j += pattern[j:j + 1] == "]"
            while j < len(pattern) and pattern[j] != "]":
                if pattern[j] == "[" and pattern[j + 1:j + 2] != ":":
                    return None  # a set inside a set (version 1 syntax), or "[" in a set: not read here
                if pattern[j] == "[":  # [:alpha:]
                    end = pattern.find(":]", j + 2)
                    if end == -1:
                        return None
                    j = end + 2
                    continue
                j += 2 if pattern[j] == "\\" else 1
            if j >= len(pattern):
                return None
            relaxed.append(pattern[i:j + 1])
            original.append(pattern[i:j + 1])
            i = j + 1
        elif c == "#" and verbose:  # a comment to the line's end, left out ("#" in a set: read whole above)
            end = pattern.find("\n", i)
            i = len(pattern) if end == -1 else end
        elif c == "(":
            if pattern.startswith("(?#", i):  # a comment
                end = pattern.find(")", i)
                if end == -1:
                    return None
                i = end + 1
                continue
            behind = pattern.startswith(("(?<=", "(?<!"), i)
            dropped = drop_lookbehinds and behind and (len(stack) > 1 or i > lead)
            if dropped and any(n or "".join(o[:3]) == "(?=" for _, o, n, _ in stack):
                # (a lookbehind in a negative lookaround; or in a lookahead, whose match left out
                # reads no further than the lookahead's text: "a(?=.*?(?<!a))" on "aa" is "a" then
                # "(?=.*?)" from 0, a whole match short of the text's end, passed over as one more
                # text cannot make new, where "aab" makes the pattern's first match "a" from 0)
                return None
            neg = not dropped and (pattern.startswith("(?!", i) or pattern.startswith("(?<!", i))
            head = pattern[i:i + (3 if pattern.startswith("(?!", i) else 4)] if neg or dropped else "("
            # a capturing group or a backreference by name, in a negative lookaround written twice
            # or in a lookbehind left out, would renumber the groups
            if any(n or d for _, _, n, d in stack) and (not pattern.startswith("(?", i)
                                                        or re.match(r"\(\?(P?<(?![=!])|P=)", pattern[i:])):
                return None
            stack.append(([head], [head], neg, dropped))
            i += len(head)
        elif c == ")":
            if len(stack) == 1:
                return None
            r, o, neg, dropped = stack.pop()
            if dropped:
                r_text = "(?:)"
            elif neg:  # r, o: the head ("(?!" or "(?<!") and X
                look = "(?=" if o[0] == "(?!" else "(?<="
                mark = ""
                if lookaheads is not None and o[0] == "(?!":  # (an empty group marks where it stood)
                    mark = f"(?P<{LOOKAHEAD_MARK}{len(lookaheads)}>)"
                    lookaheads.append("".join(r[1:]))
                r_text = "(?:" + (look + "".join(r[1:]) + ")(?!)|" if partial else "") + "".join(o) + ")" + mark + ")"
            else:
                r_text = "".join(r) + ")"
            stack[-1][0].append(r_text)
            stack[-1][1].append("".join(o) + ")")
            i += 1
        else:
            relaxed.append(forms.get(c, c))
            original.append(c)
            i += 1
    if len(stack) != 1:
        return None
    return "".join(stack[0][0])


def _read_alike(pattern: str) -> bool:
    """Whether Python's parser reads ``pattern`` as the regex package does
    (``regex_reach.parse_as_python``): in verbose mode, then, every group head is whole ("(?!",
    not "(? !"), "#" opens a comment only outside sets and a newline ends it."""
    from lmnb_engine.regex_reach import Unreadable, parse_as_python

    try:
        parse_as_python(pattern)
    except Unreadable:
        return False
    return True


@functools.lru_cache(maxsize=1024)
def ending_by(pattern: str, after: int, exact: bool = False) -> Any:
    """``pattern`` matching only where at least ``after`` characters follow its match, with POSIX
    leftmost-longest matching (``exact``: exactly that many, the first match), by a lookahead for
    them and the text's end, its global flags kept first; None where that form does not compile.
    ``pattern`` must compile itself (its callers pass a compiled stop regex's or relaxed form's
    ``.pattern``).

    Raises:
        regex.error: ``pattern`` does not compile (``ValueError`` for flags it sets that clash,
            as ``regex.compile`` raises).
    """
    import regex

    lead = global_flags(pattern)
    # (a verbose pattern may end in a comment, which a newline ends)
    end = "\n" if regex.compile(pattern).flags & regex.VERBOSE else ""
    count = f"{{{after}}}" if exact else f"{{{after},}}"
    try:
        return regex.compile(f"{lead}(?:{pattern[len(lead):]}{end})(?=[\\s\\S]{count}\\Z)", 0 if exact else regex.POSIX)
    except regex.error:
        return None
