"""Unicode property classes, ``\\p{...}``, whose name no regex dialect knows (``\\p{Lettr}``),
found before a backend reads the pattern, with the name meant where one is close.

A name is unknown where ECMA 262 (JSON Schema's dialect; its tables of general categories and
binary properties, section 22.2.2.9, are below), the ``regex`` package (whose tables, loosely
matched, hold its scripts, and more) and Rust's regex (the engine's automaton library, which reads
a few more: ``\\p{Age=3.0}``) all do not read it; the name offered is one of ECMA's own.
"""

from __future__ import annotations

import functools
import re
from typing import Optional

from lmnb_engine.suggest import close_match

# ECMA 262's General_Category values with their aliases (Unicode's PropertyValueAliases.txt), and
# its binary properties with theirs (table "Binary Unicode property aliases"): the names \p{...}
# takes alone under the u flag
_GENERAL_CATEGORIES = """
C Other Cc Control cntrl Cf Format Cn Unassigned Co Private_Use Cs Surrogate L Letter LC Cased_Letter
Ll Lowercase_Letter Lm Modifier_Letter Lo Other_Letter Lt Titlecase_Letter Lu Uppercase_Letter M Mark
Combining_Mark Mc Spacing_Mark Me Enclosing_Mark Mn Nonspacing_Mark N Number Nd Decimal_Number digit
Nl Letter_Number No Other_Number P Punctuation punct Pc Connector_Punctuation Pd Dash_Punctuation
Pe Close_Punctuation Pf Final_Punctuation Pi Initial_Punctuation Po Other_Punctuation Ps Open_Punctuation
S Symbol Sc Currency_Symbol Sk Modifier_Symbol Sm Math_Symbol So Other_Symbol Z Separator
Zl Line_Separator Zp Paragraph_Separator Zs Space_Separator""".split()
_BINARY_PROPERTIES = """
ASCII ASCII_Hex_Digit AHex Alphabetic Alpha Any Assigned Bidi_Control Bidi_C Bidi_Mirrored Bidi_M
Case_Ignorable CI Cased Changes_When_Casefolded CWCF Changes_When_Casemapped CWCM Changes_When_Lowercased
CWL Changes_When_NFKC_Casefolded CWKCF Changes_When_Titlecased CWT Changes_When_Uppercased CWU Dash
Default_Ignorable_Code_Point DI Deprecated Dep Diacritic Dia Emoji Emoji_Component EComp Emoji_Modifier
EMod Emoji_Modifier_Base EBase Emoji_Presentation EPres Extended_Pictographic ExtPict Extender Ext
Grapheme_Base Gr_Base Grapheme_Extend Gr_Ext Hex_Digit Hex IDS_Binary_Operator IDSB IDS_Trinary_Operator
IDST ID_Continue IDC ID_Start IDS Ideographic Ideo Join_Control Join_C Logical_Order_Exception LOE
Lowercase Lower Math Noncharacter_Code_Point NChar Pattern_Syntax Pat_Syn Pattern_White_Space Pat_WS
Quotation_Mark QMark Radical Regional_Indicator RI Sentence_Terminal STerm Soft_Dotted SD
Terminal_Punctuation Term Unified_Ideograph UIdeo Uppercase Upper Variation_Selector VS White_Space space
XID_Continue XIDC XID_Start XIDS""".split()
ECMA_PROPERTY_NAMES = (*_GENERAL_CATEGORIES, *_BINARY_PROPERTIES)
# (the names of ECMA's properties with values: \p{Script=Greek}; a general category's name may come first too)
_VALUED = {"General_Category": _GENERAL_CATEGORIES, "gc": _GENERAL_CATEGORIES}

_CLASS = re.compile(r"\\([pP])\{\^?([^}]*)\}")


@functools.lru_cache(maxsize=256)
def _known(name: str) -> bool:
    """Whether the ``regex`` package reads ``\\p{name}``."""
    import regex

    try:
        regex.compile(f"\\p{{{name}}}")
    except regex.error:
        return False
    return True


def unknown_property(cls: str) -> bool:
    """Whether the Unicode property class ``cls`` (``\\p{Lettr}``, ``\\P{gc=Lettr}``, ``\\p{^Lettr}``)
    names a property, or a value, no regex dialect knows (``_known``); False for a known one
    (``\\p{L}``, ``\\p{Greek}``, ``\\p{InGreek}``, ``\\p{Age=3.0}``), which each backend's own
    checks take or refuse."""
    from lmnb_engine.regex_errors import _automaton_reads  # (it imports this module)

    m = _CLASS.fullmatch(cls)
    if m is None:
        return False
    key, equals, value = m.group(2).partition("=")
    ecma = value in _VALUED.get(key, ()) if equals else key in ECMA_PROPERTY_NAMES  # (CWKCF: ECMA's alone)
    return not ecma and not _known(m.group(2)) and not _automaton_reads(cls)


def closest_property(cls: str) -> Optional[str]:
    """The class of ECMA's property whose name is closest by ``difflib``, ignoring case, to that
    of the class ``cls`` (``\\p{Lettr}``: ``\\p{Letter}``), of the general categories for
    ``gc=Lettr`` and of all of ECMA's names for a name alone, or None where none is close (a
    script's name, ``Script=Greak``, is matched against none). ``\\p{^Lettr}``, the regex
    package's negation, which ECMA lacks, gives ``\\P{Letter}``."""
    m = _CLASS.fullmatch(cls)
    if m is None:
        return None
    key, equals, value = m.group(2).partition("=")
    candidates = _VALUED.get(key.strip(), ()) if equals else ECMA_PROPERTY_NAMES
    by_lower = {c.lower(): c for c in candidates}
    close = close_match((value if equals else key).strip().lower(), by_lower)
    if close is None:
        return None
    letter = m.group(1) if not cls.startswith("{^", 2) else "P" if m.group(1) == "p" else "p"
    return f"\\{letter}{{{key + '=' if equals else ''}{by_lower[close]}}}"
