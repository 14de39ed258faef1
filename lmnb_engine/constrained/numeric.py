"""Regexes for JSON integers and numbers within bounds.

outlines-core's schema builder ignores ``minimum`` / ``maximum`` / ``exclusiveMinimum`` /
``exclusiveMaximum`` (it emits the unbounded JSON number grammar), so a bounded field would decode
values that fail validation. These functions build the bounded grammar instead; ``schema.py``
splices it into the library's regex.

The construction is the usual digit-by-digit range split (as in ``regex-for-range`` tools): a
range of equal-length digit strings ``[lo, hi]`` is ``lo[0]`` followed by ``[lo[1:], 99..]``,
the digits strictly between the leading digits followed by any digits, and ``hi[0]`` followed by
``[00.., hi[1:]]``; ranges spanning several lengths are split per length. Numbers use the
integer-part range plus a rule for the fraction at the bounds, so only integer bounds are
supported for ``type: number`` (a bound like 0.5 raises ``GrammarError``). Output never has an
exponent or leading zeros.
"""

from __future__ import annotations

from lmnb_engine.constrained.errors import GrammarError

_FRACTION = r"(?:\.[0-9]+)?"
_ZERO_FRACTION = r"(?:\.0+)?"
_NONZERO_FRACTION = r"\.[0-9]*[1-9][0-9]*"


def _alt(alternatives: list[str]) -> str:
    return alternatives[0] if len(alternatives) == 1 else "(?:" + "|".join(alternatives) + ")"


def _digits(lo: int, hi: int) -> str:
    return str(lo) if lo == hi else f"[{lo}-{hi}]"


def _any_digits(n: int) -> str:
    return "" if n == 0 else ("[0-9]" if n == 1 else f"[0-9]{{{n}}}")


def _same_length(lo: str, hi: str) -> list[str]:
    """Alternatives matching the digit strings of length ``len(lo) == len(hi)`` in ``[lo, hi]``."""
    if lo == hi:
        return [lo]
    rest = len(lo) - 1
    if lo[0] == hi[0]:
        return [lo[0] + _alt(_same_length(lo[1:], hi[1:]))]
    out = []
    first = int(lo[0]) if lo[1:] == "0" * rest else int(lo[0]) + 1
    last = int(hi[0]) if hi[1:] == "9" * rest else int(hi[0]) - 1
    if lo[1:] != "0" * rest:
        out.append(lo[0] + _alt(_same_length(lo[1:], "9" * rest)))
    if first <= last:
        out.append(_digits(first, last) + _any_digits(rest))
    if hi[1:] != "9" * rest:
        out.append(hi[0] + _alt(_same_length("0" * rest, hi[1:])))
    return out


def _natural_range(lo: int, hi: int | None) -> list[str]:
    """Alternatives for the decimals (no leading zeros) of the integers in ``[lo, hi]``, lo >= 0.

    ``hi=None`` means unbounded above. Empty list when the range is empty.
    """
    if hi is not None and lo > hi:
        return []
    out: list[str] = []
    top_len = len(str(hi)) if hi is not None else len(str(lo))
    for length in range(len(str(lo)), top_len + 1):
        a = max(lo, 10 ** (length - 1) if length > 1 else 0)
        b = 10**length - 1 if hi is None else min(hi, 10**length - 1)
        if a <= b:
            out.extend(_same_length(str(a), str(b)))
    if hi is None:
        out.append(f"[1-9][0-9]{{{top_len},}}")
    return out


def integer_range_regex(minimum: int | None, maximum: int | None) -> str:
    """Regex for the JSON integers ``n`` with ``minimum <= n <= maximum`` (None = unbounded).

    Raises:
        GrammarError: the range is empty.
    """
    alternatives = []
    if minimum is None or minimum < 0:  # negative part: n = -m, m >= 1
        m_lo = 1 if maximum is None or maximum >= 0 else -maximum
        m_hi = None if minimum is None else -minimum
        alternatives += ["-" + a for a in _natural_range(m_lo, m_hi)]
    if maximum is None or maximum >= 0:
        alternatives += _natural_range(max(minimum or 0, 0), maximum)
    if not alternatives:
        raise GrammarError(f"no integer n satisfies {minimum} <= n <= {maximum}; fix the bounds")
    return _alt(alternatives)


def _magnitude(a: int, a_excl: bool, b: int | None, b_excl: bool) -> list[str]:
    """Alternatives for unsigned decimals m = I.F with a < or <= m < or <= b (integer bounds)."""
    out = [r + _FRACTION for r in _natural_range(a + 1 if a_excl else a, None if b is None else b - 1)]
    if a_excl and (b is None or a < b):
        out.append(f"{a}{_NONZERO_FRACTION}")
    if b is not None and not b_excl and (a < b or (a == b and not a_excl)):
        out.append(f"{b}{_ZERO_FRACTION}")
    return out


def number_range_regex(
    minimum: int | None, maximum: int | None, exclusive_minimum: bool = False, exclusive_maximum: bool = False
) -> str:
    """Regex for JSON numbers x (no exponent) with ``minimum <(=) x <(=) maximum``.

    Bounds are integers or None (unbounded); ``exclusive_*`` make that bound strict.

    Raises:
        GrammarError: the range is empty.
    """
    alternatives = []
    if maximum is None or maximum > 0 or (maximum == 0 and not exclusive_maximum):
        if minimum is None or minimum < 0:
            a, a_excl = 0, False
        else:
            a, a_excl = minimum, exclusive_minimum
        alternatives += _magnitude(a, a_excl, maximum, exclusive_maximum)
    if minimum is None or minimum < 0:  # x = -m with m > 0
        if maximum is None or maximum >= 0:
            a, a_excl = 0, True
        else:
            a, a_excl = -maximum, exclusive_maximum
        b = None if minimum is None else -minimum
        alternatives += ["-" + r for r in _magnitude(a, a_excl, b, exclusive_minimum)]
    if not alternatives:
        lo = "<" if exclusive_minimum else "<="
        hi = "<" if exclusive_maximum else "<="
        raise GrammarError(f"no number x satisfies {minimum} {lo} x {hi} {maximum}; fix the bounds")
    return _alt(alternatives)
