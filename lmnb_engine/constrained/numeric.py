"""Regexes for JSON integers and numbers within bounds.

outlines-core's schema builder ignores ``minimum`` / ``maximum`` / ``exclusiveMinimum`` /
``exclusiveMaximum`` (it emits the unbounded JSON number grammar), so a bounded field would decode
values that fail validation. These functions build the bounded grammar instead; ``schema.py``
splices it into the library's regex.

The construction is the usual digit-by-digit range split (as in ``regex-for-range`` tools): a
range of equal-length digit strings ``[lo, hi]`` is ``lo[0]`` followed by ``[lo[1:], 99..]``,
the digits strictly between the leading digits followed by any digits, and ``hi[0]`` followed by
``[00.., hi[1:]]``; ranges spanning several lengths are split per length. Numbers use the
integer-part range plus, at a bound's integer part, the same split over the fraction digits
(``_fraction_digits``), so decimal bounds like 0.05 work. Output never has an exponent or leading
zeros.
"""

from __future__ import annotations

from decimal import Decimal

from lmnb_engine.constrained.errors import GrammarError

_FRACTION = r"(?:\.[0-9]+)?"
# Decimals of up to 15 significant digits (C's DBL_DIG) round to distinct floats, in order.
SIGNIFICANT_DIGITS = 15
# Integer parts from here on are written without a fraction: a value with one is read as a float,
# which can round past a bound there (9007199254740993.0 is ...992); an integer is read exactly.
_LARGEST_WITH_FRACTION = 10**SIGNIFICANT_DIGITS - 1
# A number range unbounded in magnitude stops at 308 integer digits: read as a float (jsonschema,
# pydantic), a longer value is infinity, which pydantic's FiniteFloat refuses and JSON cannot write.
FINITE_DIGITS = 308


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


def _natural_range(lo: int, hi: int | None, longest: int | None = None) -> list[str]:
    """Alternatives for the decimals (no leading zeros) of the integers in ``[lo, hi]``, lo >= 0.

    ``hi=None`` means unbounded above, up to ``longest`` digits if given. Empty list when the range
    is empty.
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
    if hi is None and (longest is None or longest > top_len):
        out.append(f"[1-9][0-9]{{{top_len},{'' if longest is None else longest - 1}}}")
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


def _zero_within(lo: str, lo_excl: bool, hi: str | None, hi_excl: bool) -> bool:
    """Whether 0 lies within ``lo <(=) 0 <(=) hi`` (fraction digit strings, as in ``_fraction_digits``)."""
    return lo == "" and not lo_excl and not (hi == "" and hi_excl)


def _tail(digit: str, rest: str | None, rest_empty: bool) -> str | None:
    """``digit`` followed by a match of ``rest`` (or by nothing, if ``rest_empty``); None: no match."""
    if rest is None:
        return digit if rest_empty else None
    return f"{digit}(?:{rest})?" if rest_empty else f"{digit}(?:{rest})"


def _some_digits(room: int | None, low: int = 0) -> str:
    """``[0-9]*`` with at least ``low`` and at most ``room`` digits (None: no limit)."""
    return f"[0-9]{{{low},}}" if room is None else f"[0-9]{{{low},{room}}}"


def _fraction_digits(lo: str, lo_excl: bool, hi: str | None, hi_excl: bool, room: int | None) -> str | None:
    """Regex of the non-empty digit strings ``D`` of at most ``room`` digits (None: any number)
    with ``0.lo <(=) 0.D <(=) 0.hi``, or None if none.

    ``lo`` and ``hi`` are fraction digit strings without trailing zeros ("" is 0); ``hi=None``
    means no bound below 1. Split on the first digit like ``_same_length``: a first digit strictly
    between the bounds' takes any digits after it, one equal to a bound's recurses on the rest.
    """
    if room is not None and room < 1:
        return None
    rest_room = None if room is None else room - 1
    if lo == "" and hi is None:
        if not lo_excl:
            return _some_digits(room, 1)
        # not all zeros: the first non-zero digit at some place
        if room is None:
            return "[0-9]*[1-9][0-9]*"
        return _alt(["0" * p + f"[1-9]{_some_digits(room - 1 - p)}" for p in range(room)])
    if hi == "":
        return None if lo_excl or hi_excl or lo != "" else ("0+" if room is None else f"0{{1,{room}}}")
    l0, l_rest = (int(lo[0]), lo[1:]) if lo else (0, "")
    h0, h_rest = (10, None) if hi is None else (int(hi[0]), hi[1:])
    if l0 == h0:
        alternatives = [_tail(str(l0), _fraction_digits(l_rest, lo_excl, h_rest, hi_excl, rest_room),
                              _zero_within(l_rest, lo_excl, h_rest, hi_excl))]
    else:
        alternatives = [_tail(str(l0), _fraction_digits(l_rest, lo_excl, None, False, rest_room),
                              _zero_within(l_rest, lo_excl, None, False))]
        if l0 + 1 <= h0 - 1:
            alternatives.append(_digits(l0 + 1, h0 - 1) + _some_digits(rest_room))
        if h0 < 10:
            alternatives.append(_tail(str(h0), _fraction_digits("", False, h_rest, hi_excl, rest_room),
                                      _zero_within("", False, h_rest, hi_excl)))
    alternatives = [a for a in alternatives if a is not None]
    return _alt(alternatives) if alternatives else None


def _fraction(lo: str, lo_excl: bool, hi: str | None, hi_excl: bool, room: int | None = None) -> str | None:
    """Regex of what may follow the integer part ("" or ``.D``) for a fraction within the bounds
    (``_fraction_digits``); None if nothing may."""
    digits = _fraction_digits(lo, lo_excl, hi, hi_excl, room)
    empty = _zero_within(lo, lo_excl, hi, hi_excl)
    if digits is None:
        return "" if empty else None
    return f"(?:\\.{digits})?" if empty else f"\\.{digits}"


def decimal_parts(value: Decimal) -> tuple[int, str]:
    """(integer part, fraction digits without trailing zeros) of a decimal >= 0: (2, "05") for 2.050."""
    whole, _, fraction = format(value, "f").partition(".")
    return int(whole), fraction.rstrip("0")


def _magnitude(a: Decimal, a_excl: bool, b: Decimal | None, b_excl: bool) -> list[str]:
    """Alternatives for unsigned decimals m = I.F with a <(=) m <(=) b (b None: unbounded),
    0 <= a <= b: the integer parts strictly between the bounds' take any fraction, those equal to
    a bound's integer part a fraction bounded by the bound's fraction (``_fraction``).

    Next to an exclusive bound (its integer part, and the one below an integral upper bound) a
    value has at most ``SIGNIFICANT_DIGITS`` digits in all: a longer one could round, as a float,
    onto the bound (``0.99999999999999999`` is 1.0), and validators compare floats. Integer parts
    above ``_LARGEST_WITH_FRACTION`` take no fraction at all.
    """
    a_int, a_frac = decimal_parts(a)
    b_int, b_frac = (None, None) if b is None else decimal_parts(b)
    near = {a_int} if a_excl else set()
    if b_excl and b is not None:
        near |= {b_int, b_int - 1} if b_frac == "" else {b_int}
    out: list[str] = []

    def part(whole: int, lo: str, lo_excl: bool, hi: str | None, hi_excl: bool) -> None:
        """``whole`` with the fractions ``lo <(=) .F <(=) hi``, if any."""
        if whole > _LARGEST_WITH_FRACTION:
            room = 0
        elif whole in near:
            room = max(SIGNIFICANT_DIGITS - len(str(whole)), 0)
        else:
            room = None
        fraction = _fraction(lo, lo_excl, hi, hi_excl, room)
        if fraction is not None:
            out.append(f"{whole}{fraction}")

    if b is not None and a_int == b_int:
        part(a_int, a_frac, a_excl, b_frac, b_excl)
        return out
    part(a_int, a_frac, a_excl, None, False)
    last = None if b is None else b_int - 1
    # the integer parts strictly between, but the one below an exclusive integral bound (near too)
    below = last - 1 if last is not None and last in near and last > a_int else last
    with_fraction = _LARGEST_WITH_FRACTION if below is None else min(below, _LARGEST_WITH_FRACTION)
    out += [r + _FRACTION for r in _natural_range(a_int + 1, with_fraction)]
    out += _natural_range(max(a_int + 1, _LARGEST_WITH_FRACTION + 1), below, FINITE_DIGITS)
    if below != last:
        part(last, "", False, None, False)
    if b is not None:
        part(b_int, "", False, b_frac, b_excl)
    return out


def number_range_regex(
    minimum: Decimal | int | None, maximum: Decimal | int | None, exclusive_minimum: bool = False,
    exclusive_maximum: bool = False,
) -> str:
    """Regex for JSON numbers x (no exponent) with ``minimum <(=) x <(=) maximum``.

    Bounds are exact decimals (``Decimal`` or ``int``) or None (unbounded); ``exclusive_*`` make
    that bound strict. Next to an exclusive bound values have at most ``SIGNIFICANT_DIGITS``
    digits (``_magnitude``), so a validator that reads them as floats (jsonschema) agrees.

    Raises:
        GrammarError: the range is empty.
    """
    lo = None if minimum is None else Decimal(minimum)
    hi = None if maximum is None else Decimal(maximum)
    if lo is not None and hi is not None and (lo > hi or (lo == hi and (exclusive_minimum or exclusive_maximum))):
        lo_op = "<" if exclusive_minimum else "<="
        hi_op = "<" if exclusive_maximum else "<="
        raise GrammarError(f"no number x satisfies {minimum} {lo_op} x {hi_op} {maximum}; fix the bounds")
    alternatives = []
    if hi is None or hi > 0 or (hi == 0 and not exclusive_maximum):
        a, a_excl = (Decimal(0), False) if lo is None or lo < 0 else (lo, exclusive_minimum)
        alternatives += _magnitude(a, a_excl, hi, exclusive_maximum)
    if lo is None or lo < 0:  # x = -m with m > 0
        a, a_excl = (Decimal(0), True) if hi is None or hi >= 0 else (-hi, exclusive_maximum)
        alternatives += ["-" + r for r in _magnitude(a, a_excl, None if lo is None else -lo, exclusive_minimum)]
    if not alternatives:  # (e.g. 0 < x < 1e-15)
        raise GrammarError(f"no number x written with at most {SIGNIFICANT_DIGITS} digits satisfies {minimum} "
                           f"{'<' if exclusive_minimum else '<='} x {'<' if exclusive_maximum else '<='} {maximum} "
                           "(validators read numbers as floats, and a longer one could round onto a bound); "
                           "widen the bounds")
    return _alt(alternatives)
