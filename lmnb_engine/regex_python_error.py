"""What Python's ``re`` finds wrong in a pattern, in the words every front end uses, and a pattern
shown in a message.

``shown_regex`` writes a pattern for a message (as JSON writes a string, cut when long), so that an
error reads the same in Python and from the server. ``python_error`` and ``error_words`` word ``re``'s
error on a pattern read with its Unicode classes held (``regex_parts.classes_held``), placed in the
text the user wrote (a bad range as written, a class where no class can stand), ``invalid_regex`` is
the whole message for a ``regex`` constraint, and ``python_reading`` tells whether two patterns parse
alike. A ``stop_regex``'s error is worded and placed here as a ``regex``'s is.
"""

from __future__ import annotations

import re
import warnings
from typing import Callable

from lmnb_engine.json_schema import SHOWN_CHARS, json_value
from lmnb_engine.regex_parts import class_items, classes_held, unicode_classes
from lmnb_engine.regex_tree import parser


def shown_regex(pattern: str) -> str:
    """``pattern`` for a message, written as JSON writes a string (``"a["``), so that the error reads
    the same in Python and from the server, cut after ``SHOWN_CHARS`` characters (a schema's regex
    runs to kilobytes)."""
    return json_value(pattern, SHOWN_CHARS)


def invalid_regex(pattern: str, error: re.error, fix: str = "fix the pattern") -> str:
    """The message for a ``regex`` constraint that Python's ``re`` refused with ``error`` (read with
    its Unicode classes held: ``classes_held``): the pattern (``shown_regex``), what is wrong and
    where (``error_words``), and the fix (``fix``: what to write, where more is known)."""
    return (f"regex {shown_regex(pattern)} cannot be compiled: it is not a valid regular expression "
            f"({error_words(pattern, error)}); {fix}")


def error_words(pattern: str, error: re.error, place: Callable[[int], int] | None = None,
                written: str | None = None) -> str:
    """What ``error``, Python's ``re`` error on ``pattern`` with its Unicode classes held, says is
    wrong and where (``error.pos``, a character index into ``pattern``, or into ``written``, the
    text the user wrote, ``place(index)``, where ``pattern`` respells it): ``error.msg`` at that
    position (the message alone where ``error.pos`` is None), a bad character range as the user
    wrote it (``_bad_range``), unless the message quotes the text holding a class (a class in a group's name, ``(?P<\\p{L}>...)``, or after
    ``(?``): then the class, by its own text, and where it stands."""
    place = place or (lambda index: index)
    where = _bad_range(pattern, error, place, written or pattern)
    # (re gives no position for a look-behind of varying width, found as the pattern compiles)
    where = where or (error.msg if error.pos is None else f"{error.msg} at position {place(error.pos)}")
    classes = unicode_classes(pattern)
    if not classes or error.pos is None:
        return where
    try:  # the message quotes held text when it changes with the character that holds the classes
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            re.compile(classes_held(pattern, hold=","))
    except re.error as other:
        if other.msg == error.msg:
            return where
    except (RecursionError, OverflowError):
        return where
    cls = next((m for m in classes if m.end() > error.pos), classes[-1])
    return (f"the class {cls.group(2)} at position {place(cls.start(2))} stands where no class can: in a group's name or "
            "reference, after \"(?\", or as an end of a range")


_BAD_RANGE = "bad character range "


def _bad_range(pattern: str, error: re.error, place: Callable[[int], int], written: str) -> str | None:
    """Python's "bad character range" ``error`` on ``pattern`` with the range as the user wrote it
    and where it starts in ``written`` (``place``: ``error_words``), or None for another error.
    Python's message shows only the first two characters of an escape at either end (``\\x-\\x``
    for ``[\\x5a-\\x41]``) and places it that many characters after the range's start (it
    subtracts the shown length from where it stopped reading), so the range is found by its end:
    ``error.pos`` plus that length, the end of a class item (``class_items``) two items after
    the range's start."""
    if not error.msg.startswith(_BAD_RANGE) or error.pos is None:
        return None
    end = error.pos + len(error.msg) - len(_BAD_RANGE)
    for items in class_items(pattern):
        for k in range(2, len(items)):
            if items[k][1] == end and items[k - 1] == (items[k - 2][1], items[k - 2][1] + 1):
                start = place(items[k - 2][0])
                return f"{_BAD_RANGE}{written[start:place(end)]} at position {start}"
    return None


def python_error(pattern: str, place: Callable[[int], int] | None = None, written: str | None = None) -> str | None:
    """What Python's ``re`` finds wrong in ``pattern`` and where (``error_words``, with ``place`` and
    ``written``), reading its Unicode classes as classes (held: ``classes_held``), or None where it
    reads the pattern.
    ``stop_regex`` errors use it, so that a pattern's error is worded, and placed, as a
    ``regex``'s is (the ``regex`` package, which stop strings match with, places an open group's
    error at the pattern's end, where it gave up)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            re.compile(classes_held(pattern))
    except re.error as e:
        return error_words(pattern, e, place, written)
    except (RecursionError, OverflowError):  # (not re's words: the regex package's are kept)
        pass
    return None


def python_reading(pattern: str) -> str | None:
    """Python's parse of ``pattern`` (warnings ignored), written out (a group's parse compares by
    identity, its text by value), or None where it cannot read it, or holds a Unicode class, which
    Python reads only held by other characters: two patterns Python reads alike parse alike."""
    if unicode_classes(pattern):
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return repr(parser.parse(pattern))
    except (re.error, RecursionError, OverflowError):
        return None
