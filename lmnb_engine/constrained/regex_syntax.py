"""A user's regex, read as Python's ``re`` reads it, spelled so the automaton library reads the same.

lmnb checks patterns with Python's parser (``regex_check``) and documents Python's syntax, but
outlines-core builds its automaton with the ``regex-automata`` crate, whose syntax differs. Python
spellings it refuses with a bare "error building NFA": ``a{,3}`` and ``a{,}`` (counts from 0), a
``{`` that Python reads as a literal (``{abc}``, ``a{x}``), octal escapes (``\\0``, ``\\040``),
``\\N{NAME}``, an escaped non-ASCII character, ``(?#comments)``; ones it reads otherwise: ``\\<``
and ``\\>`` (word boundaries there, literals in Python), and inside a class ``[``, ``&&``, ``--``,
``~~`` (nested classes and set operations there), ``[\\b]`` (a backspace in Python), ``[]-a]`` (a
range from ``]`` in Python). So every escape that stands for one character is written as that
character's ``\\UXXXXXXXX`` escape, which both read alike, and every class is written out again
item by item, as Python's parser reads it. Verbose patterns (``(?x)``) lose their whitespace and
comments first. What Python itself flags as ambiguous (``[[:alpha:]]``, ``[a&&b]``: a
FutureWarning) is refused with the fix rather than guessed (in ``regex_errors``' words, which the
language's ``gen()`` uses too), and so are the flags the library lacks (``(?a)``) or scopes
otherwise (``(?x:...)``). A Unicode property class (``\\p{L}``) is kept as it is, in a class too.

Two characters are left out of every class, ``.`` and negated category: ``MARKER`` (U+10FFFE)
and U+10FFFF, noncharacters no text holds, with which ``grammar.compile_grammar`` marks where a
match starts and ends. Were the first allowed inside, each one in the text would begin another
match in the automaton's unanchored half, which then doubles with each repeat (``.{0,20}`` would
not compile); the second, read as text, ends the match there. The surrogates U+D800-U+DFFF, which
no UTF-8 text holds and the library refuses in a class, are left out of classes too (in a negated
class: a single one, a range of them alone, and a range ending in one, which is cut at them; a
negated class that leaves nothing but them matches nothing); one outside a class is refused.

``\\d``, ``\\w``, ``\\s`` and their negations are written out as classes of the characters Python's
``re`` gives them (``python_category``): the library's Unicode tables differ (its ``\\w`` holds the
combining marks of Devanagari or Thai words and ``⁔``, Python's holds ``½``; its ``\\s`` lacks
``\\x1c``-``\\x1f``). Under ``(?i)``, Python folds ``i``, ``I``, ``ı`` and ``İ`` all together (``İ``
lowers to ``i``, and its case table pairs ``ı`` with ``i``) where the library's simple case folding
pairs only ``i`` and ``I``: a literal of the four is written as a class of them all, and a class
gets those of the four that Python's holds (a negated one: leaves out those it does not). The
library agrees with Python on the other case pairs (the Kelvin sign and ``k``, ``ſ`` and ``s``).
Inside a class they are inlined, never nested as a class of their own: ``grammar.compile_grammar``
reads the pattern with Python (``may_hold``), to which ``[^[...]...]`` ends at the first ``]``; a
negated class with a negated category in it (``[^\\W_]``) is written out as the characters
Python's class holds, read under the ``(?i)`` that holds there.
"""

from __future__ import annotations

import functools
import re
import warnings

from lmnb_engine.constrained.errors import GrammarError
from lmnb_engine.constrained.vocab import START_MARKER
from lmnb_engine.regex_ambiguous_class import ambiguous_class
from lmnb_engine.regex_parts import SCOPED_FLAGS, UNICODE_CLASS_AT, classes_held
from lmnb_engine.regex_errors import surrogate_words
from lmnb_engine.regex_python_error import shown_regex
from lmnb_engine.regex_unicode_classes import class_range_problem, unbuilt_class_problem
from lmnb_engine.regex_tree import constants as _c, parser as _p, walk

MARKER = ord(START_MARKER)  # left out of every class and '.': compile_grammar marks the start with it,
# and the end with the next character, U+10FFFF (as text it would end a complete match there)
_LEFT_OUT = f"\\U{MARKER:08x}-\\U{MARKER + 1:08x}"  # (as _char writes them)
_SURROGATES = (0xD800, 0xDFFF)  # no UTF-8 text holds them, and the library refuses them in a class

_COUNT = re.compile(r"\{(\d*)(?:(,)(\d*))?\}")  # what Python reads as a repeat count after an item
_FLAGS = re.compile(r"\(\?([aiLmsux]+)\)")  # a global flag group (Python 3.11: only at the start)
_OCTAL = "01234567"
_HEX_DIGITS = {"x": 2, "u": 4, "U": 8}
_VERBOSE_SPACE = " \t\n\r\v\f"
_NEGATED_CATEGORIES = {"\\W": "\\w", "\\S": "\\s", "\\D": "\\d"}
# The head of a group that holds letters: a flag group's, a named group's
_GROUP_HEAD = re.compile(r"\(\?(?:[aiLmsux]*(?:-[imsx]+)?:|P<\w+>)")


_CATEGORY_TESTS = {  # Python's re (sre) on str: \\d is isdecimal, \\s isspace, \\w isalnum or '_'
    "\\d": str.isdecimal,
    "\\s": str.isspace,
    "\\w": lambda ch: ch.isalnum() or ch == "_",
}


@functools.cache
def python_category(name: str) -> str:
    """The class items (no brackets) of the characters Python's ``re`` matches with ``name``
    (``\\d``, ``\\w`` or ``\\s``), range by range, from this Python's Unicode tables."""
    return _members(_CATEGORY_TESTS[name])


def _members(test) -> str:
    """The class items (no brackets) of the characters ``test`` holds, range by range."""
    items, start = [], None
    for code in range(0x110001):
        inside = code < 0x110000 and test(chr(code))
        if inside and start is None:
            start = code
        elif not inside and start is not None:
            last = code - 1
            items.append(_char(start) if last == start else f"{_char(start)}-{_char(last)}")
            start = None
    return "".join(items)


def _category_class(text: str) -> str | None:
    """The automaton's class for a category escape (``\\w``, or ``\\W`` without the start marker)
    with Python's members; None for any other escape."""
    if text in _CATEGORY_TESTS:
        return f"[{python_category(text)}]"
    if text in _NEGATED_CATEGORIES:
        return f"[^{python_category(_NEGATED_CATEGORIES[text])}{_LEFT_OUT}]"
    return None


def _char(code: int) -> str:
    """One character as an escape both Python and the automaton library read."""
    return f"\\U{code:08x}"


def _escape_end(pattern: str, i: int, in_class: bool) -> int:
    """End index of the escape at ``pattern[i] == '\\\\'``, as Python's parser delimits it."""
    c = pattern[i + 1]
    if c in _HEX_DIGITS:
        return i + 2 + _HEX_DIGITS[c]
    if c == "N" and pattern.startswith("{", i + 2):
        return pattern.index("}", i + 2) + 1
    if c in _OCTAL:
        j = i + 2
        while j < min(len(pattern), i + 4) and pattern[j] in _OCTAL:
            j += 1
        if in_class or c == "0" or j == i + 4:  # octal (else a group reference, refused by regex_check)
            return j
    return i + 2


def _code(text: str, in_class: bool) -> int | None:
    """The character one escape (``text`` as ``_escape_end`` delimits it) stands for, or None
    (``\\d``, an anchor ...), as Python's parser reads it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        parsed = _p.parse(f"[{text}]" if in_class else text).data
    return parsed[0][1] if len(parsed) == 1 and parsed[0][0] is _c.LITERAL else None


def _escaped(text: str, in_class: bool) -> str:
    """The automaton's spelling of one escape: the character's own escape if it stands for one
    character; a negated category without the start marker (outside a class); else as written."""
    code = _code(text, in_class)
    if code is not None:
        return _char(code)
    return _category_class(text) or text


# The characters Python's re folds together under (?i) and the automaton library's (?i) does not
_DOTTED_I = "iIıİ"
_DOTTED_I_CLASS = "[" + "".join(_char(ord(c)) for c in _DOTTED_I) + "]"


def _class(pattern: str, i: int, ignorecase: bool = False) -> tuple[str, int]:
    """(the class at ``pattern[i] == '['`` written out item by item, end index), read with
    Python's rules: a ``]`` first is a literal, ``x-y`` a range, a ``-`` before ``]`` a literal;
    ``ignorecase``: whether ``(?i)`` holds there (a class written out as its characters is read so).
    The start marker is left out: a negated class excludes it too, a range is cut around it, and
    a negated category (``\\W``) becomes an alternative of its own without it."""
    start = i
    i += 1
    negated = pattern[i] == "^"
    i += negated
    items: list[str] = []
    categories: list[str] = []
    nested = False  # a negated category in a negated class ([^\\W_]: word characters but '_')
    unicode = False  # a Unicode class in it (then a negated category stays nested: the library reads that)
    spans: list[tuple[int, int]] = []  # the characters a negated class names, cut around the surrogates

    def item(i: int) -> tuple[int | str, int]:
        if unicode_class := UNICODE_CLASS_AT.match(pattern, i):  # (never a range's end: class_range_problem)
            return unicode_class.group(), unicode_class.end()
        if pattern[i] == "\\":
            end = _escape_end(pattern, i, in_class=True)
            code = _code(pattern[i:end], in_class=True)
            return (pattern[i:end] if code is None else code), end
        return ord(pattern[i]), i + 1

    def spelled(code: int) -> str:
        ch = chr(code)
        return ch if ch.isalnum() and ch.isascii() else _char(code)

    first = True
    while pattern[i] != "]" or first:
        first = False
        low, i = item(i)
        if pattern[i] == "-" and pattern[i + 1] != "]":
            high, i = item(i + 1)
            pieces = [(low, high)] if negated else [(low, min(high, MARKER - 1))] if low < MARKER else []
            cut = [c for lo, hi in pieces for c in ((lo, min(hi, _SURROGATES[0] - 1)),
                                                    (max(lo, _SURROGATES[1] + 1), hi)) if c[0] <= c[1]]
            spans += cut if negated else []
            if not negated or _is_surrogate(low) or _is_surrogate(high):  # the library refuses a surrogate
                pieces = cut  # end ('[^a-\\udfff]'); a negated range across them stays whole (cut, it would
                # leave them in: the whole range, negated, would be surrogates to the library: dead ends)
            items += [f"{spelled(lo)}-{spelled(hi)}" if lo < hi else spelled(lo) for lo, hi in pieces]
        elif isinstance(low, str):  # a category: Python's members (a negated one nested, or apart)
            if low in _NEGATED_CATEGORIES and not negated:
                categories.append(low)
            elif low in _CATEGORY_TESTS:  # its members inline: Python reads a nested class otherwise, and
                items.append(python_category(low))  # compile_grammar's may_hold reads the pattern with Python
            else:  # (a Unicode class, \\p{L}, kept as written: may_hold reads it held, and asks the regex package)
                nested = nested or low in _NEGATED_CATEGORIES
                unicode = unicode or UNICODE_CLASS_AT.fullmatch(low) is not None
                items.append(_category_class(low) or low)
        elif (negated or low < MARKER) and not _is_surrogate(low):
            items.append(spelled(low))
            spans += [(low, low)] if negated else []
    if nested and not unicode:  # written out as the characters Python's class holds (a subset of \\w, \\d or \\s), for may_hold too
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            # (under (?i) as Python reads the class there: "(?i)[^\\Wa]" leaves out "A" too, which
            # the library's (?i) on the characters of "[^\\Wa]" alone would let back in)
            members = re.compile(pattern[start:i + 1], re.IGNORECASE if ignorecase else 0).fullmatch
        held = _members(lambda ch: members(ch) is not None)
        return (f"[{held}]" if held else "[^\\s\\S]"), i + 1
    if negated and _covers_all(spans):  # it leaves only surrogates, which no text holds: it matches nothing
        return "[^\\s\\S]", i + 1  # (the library matched other characters for such a class)
    if ignorecase:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (a Unicode class held: what its other items fold to; the
            # library folds the Unicode class itself)
            members = re.compile(classes_held(pattern[start:i + 1]), re.IGNORECASE).fullmatch
        # the dotted and dotless i Python's class holds (a negated one: those it leaves out)
        items += [_char(ord(c)) for c in _DOTTED_I if (members(c) is None) == negated]
    if negated:
        return "[^" + "".join(items) + _LEFT_OUT + "]", i + 1
    parts = (["[" + "".join(items) + "]"] if items else []) + [_escaped(c, in_class=False) for c in categories]
    return (parts[0] if len(parts) == 1 else "(?:" + "|".join(parts) + ")") if parts else "[^\\s\\S]", i + 1


def class_syntax(pattern: str, start: int, ignorecase: bool = False) -> str:
    """The character class at ``pattern[start] == '['`` (Python ``re`` syntax, as ``automaton_syntax``
    reads it) in the automaton library's syntax, as ``automaton_syntax`` writes it there
    (``ignorecase``: whether ``(?i)`` holds there)."""
    return _class(pattern, start, ignorecase)[0]


def _covers_all(spans: list[tuple[int, int]]) -> bool:
    """Whether the ``(low, high)`` code point ranges cover every character text may hold (all but
    the surrogates and the two markers)."""
    reach = 0  # every code point below it is covered
    for lo, hi in sorted(spans):
        if reach >= MARKER:  # (a gap at the markers, left out anyway, is none: [^\x00-\U0010fffd\U0010ffff])
            break
        if lo > reach and not (_SURROGATES[0] <= reach and lo <= _SURROGATES[1] + 1):
            return False
        reach = max(reach, hi + 1)
        if reach == _SURROGATES[0]:
            reach = _SURROGATES[1] + 1
    return reach >= MARKER


def _is_surrogate(code: int) -> bool:
    return _SURROGATES[0] <= code <= _SURROGATES[1]


def _refuse_surrogate(pattern: str, code: int | None) -> None:
    if code is not None and _is_surrogate(code):
        raise GrammarError(surrogate_words(pattern, code))


def _refuse_unsupported(pattern: str, parsed) -> None:
    """Refuse the flags the automaton library lacks or scopes otherwise."""
    scoped = [av[1] | av[2] for op, av in walk(parsed) if op is _c.SUBPATTERN]
    if (parsed.state.flags & re.ASCII) or any(f & re.ASCII for f in scoped):
        raise GrammarError(f"regex {shown_regex(pattern)} uses the ASCII flag (?a), which constrained decoding does not "
                           "support; write the classes out instead: [0-9] for \\d, [A-Za-z0-9_] for \\w, "
                           "[ \\t\\n\\r\\f\\v] for \\s")
    if any(f & re.VERBOSE for f in scoped):
        raise GrammarError(f"regex {shown_regex(pattern)} scopes the verbose flag to a group ((?x:...)), which "
                           "constrained decoding does not support; put (?x) at the start of the pattern")


def automaton_syntax(pattern: str) -> str:
    """``pattern`` (Python ``re`` syntax) rewritten into the automaton library's syntax with the
    same meaning (see the module docstring). Unicode property classes (``\\p{L}``), which Python
    lacks and the library reads, are kept as written, and the rest is read with them held
    (``regex_parts.classes_held``); a pattern Python cannot parse even so is returned unchanged
    (the library names its own error, which ``grammar.compile_grammar`` words as ``re`` does).

    Raises:
        GrammarError: a class whose meaning Python itself flags as ambiguous (``[[:alpha:]]``,
            ``[a&&b]``, ``[a--b]``, ``[a||b]``, ``[a~~b]``: ``regex_ambiguous_class.ambiguous_class``), a
            Unicode class the library does not build (``\\p{InGreek}``: ``regex_unicode_classes.unbuilt_class_problem``)
            or at an end of a range (``[\\p{L}-z]``: ``regex_unicode_classes.class_range_problem``),
            the ASCII flag ``(?a)`` or a scoped ``(?x:...)``, each with the fix.
    """
    # (a class the library cannot build, named as gen() names it, from the user's pattern, not the respelled one;
    # Python would read [\\p{L}-z] held as a range of two characters)
    problem = unbuilt_class_problem(pattern) or class_range_problem(pattern)
    if problem:
        raise GrammarError(problem)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        warnings.simplefilter("error", FutureWarning)
        try:  # (a Unicode class held by characters: the rest is read, refused and respelled all the same)
            parsed = _p.parse(classes_held(pattern))
        except FutureWarning as w:
            raise GrammarError(ambiguous_class(pattern, w)) from None
        except (re.error, RecursionError, OverflowError):
            return pattern
    _refuse_unsupported(pattern, parsed)
    verbose = bool(parsed.state.flags & re.VERBOSE)
    dotall = [bool(parsed.state.flags & re.DOTALL)]  # per open group: does '.' match '\\n' there
    ignorecase = [bool(parsed.state.flags & re.IGNORECASE)]  # ... and does (?i) hold there
    out, i, n = [], 0, len(pattern)
    while (flags := _FLAGS.match(pattern, i)) is not None:  # global flags; verbose is spelt out below
        kept = flags.group(1).replace("x", "")
        out.append(f"(?{kept})" if kept else "")
        i = flags.end()
    while i < n:
        ch = pattern[i]
        count = _COUNT.match(pattern, i) if ch == "{" else None
        if unicode_class := UNICODE_CLASS_AT.match(pattern, i):  # (the library reads it as the user wrote it)
            out.append(unicode_class.group())
            i = unicode_class.end()
        elif ch == "\\" and i + 1 < n:
            end = _escape_end(pattern, i, in_class=False)
            code = _code(pattern[i:end], in_class=False)
            _refuse_surrogate(pattern, code)
            dotted_i = ignorecase[-1] and code is not None and chr(code) in _DOTTED_I
            out.append(_DOTTED_I_CLASS if dotted_i else _escaped(pattern[i:end], in_class=False))
            i = end
        elif ch == "[":
            text, i = _class(pattern, i, ignorecase[-1])
            out.append(text)
        elif verbose and ch in _VERBOSE_SPACE:
            i += 1
        elif verbose and ch == "#":  # a comment to the end of the line
            end = pattern.find("\n", i)
            i = n if end < 0 else end + 1
        elif ch == ".":
            out.append(f"[^{'' if dotall[-1] else _char(10)}{_LEFT_OUT}]")
            i += 1
        elif ch == "(" and not pattern.startswith("(?#", i):
            scoped = SCOPED_FLAGS.match(pattern, i)
            on, off = (scoped.group(1), scoped.group(2) or "") if scoped else ("", "")
            dotall.append(("s" in on or dotall[-1]) and "s" not in off)
            ignorecase.append(("i" in on or ignorecase[-1]) and "i" not in off)
            head = _GROUP_HEAD.match(pattern, i)  # (its flags and name as written: no literal "i" there)
            out.append(head.group() if head else ch)
            i = head.end() if head else i + 1
        elif ch == ")":
            if len(dotall) > 1:
                dotall.pop()
                ignorecase.pop()
            out.append(ch)
            i += 1
        elif count and count.group(0) != "{}":
            lo, comma, hi = count.groups()
            out.append("{" + (lo or "0") + (comma or "") + (hi or "") + "}")
            i = count.end()
        elif ch == "{":
            out.append("\\{")
            i += 1
        elif pattern.startswith("(?#", i):  # a comment: Python ends it at the first unescaped ')'
            i += 3
            while pattern[i] != ")":
                i += 2 if pattern[i] == "\\" else 1
            i += 1
        else:
            _refuse_surrogate(pattern, ord(ch))
            out.append(_DOTTED_I_CLASS if ignorecase[-1] and ch in _DOTTED_I else ch)
            i += 1
    return "".join(out)
