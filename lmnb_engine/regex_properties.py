"""Unicode property classes, ``\\p{...}``, whose name no regex dialect knows (``\\p{Lettr}``),
found before a backend reads the pattern, with the name meant where one is close.

A name is unknown where ECMA 262 (JSON Schema's dialect; its tables of general categories and
binary properties, section 22.2.2.9, are below), the ``regex`` package (whose tables, loosely
matched, hold its scripts, and more) and Rust's regex (the engine's automaton library, which reads
a few more: ``\\p{Age=3.0}``) all do not read it; the name offered is one of ECMA's own. A name
some dialect knows that ECMA with the u flag does not read (``\\p{Greek}``, ``\\p{lu}``) is found
with ECMA's spelling (``ecma_problem``), for a schema's ``pattern``.
"""

from __future__ import annotations

import functools
import re
from typing import Optional

from lmnb_engine.json_schema import as_ranges, code_point_runs, without_surrogates
from lmnb_engine.regex_automaton import automaton_reads
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
# ECMA's names of the properties whose values are scripts (\p{Script=Greek}, \p{scx=Grek}), and those
# values (its table of Script values: Unicode's PropertyValueAliases.txt, sc, with each script's short
# name; Unicode 17's, as the regex package reads them, written out from fontTools.unicodedata), less
# _SCRIPTS_UNREAD
_SCRIPT_KEYS = ("Script", "sc", "Script_Extensions", "scx")
_SCRIPTS = tuple("""
Adlm Adlam Aghb Caucasian_Albanian Ahom Arab Arabic Armi Imperial_Aramaic Armn Armenian Avst Avestan Bali
Balinese Bamu Bamum Bass Bassa_Vah Batk Batak Beng Bengali Berf Beria_Erfe Bhks Bhaiksuki Bopo Bopomofo Brah
Brahmi Brai Braille Bugi Buginese Buhd Buhid Cakm Chakma Cans Canadian_Aboriginal Cari Carian Cham Cher
Cherokee Chrs Chorasmian Copt Coptic Cpmn Cypro_Minoan Cprt Cypriot Cyrl Cyrillic Deva Devanagari Diak
Dives_Akuru Dogr Dogra Dsrt Deseret Dupl Duployan Egyp Egyptian_Hieroglyphs Elba Elbasan Elym Elymaic Ethi
Ethiopic Gara Garay Geor Georgian Glag Glagolitic Gong Gunjala_Gondi Gonm Masaram_Gondi Goth Gothic Gran
Grantha Grek Greek Gujr Gujarati Gukh Gurung_Khema Guru Gurmukhi Hang Hangul Hani Han Hano Hanunoo Hatr Hatran
Hebr Hebrew Hira Hiragana Hluw Anatolian_Hieroglyphs Hmng Pahawh_Hmong Hmnp Nyiakeng_Puachue_Hmong
Hung Old_Hungarian Ital Old_Italic Java Javanese Kali Kayah_Li Kana Katakana
Kawi Khar Kharoshthi Khmr Khmer Khoj Khojki Kits Khitan_Small_Script Knda Kannada Krai Kirat_Rai Kthi Kaithi
Lana Tai_Tham Laoo Lao Latn Latin Lepc Lepcha Limb Limbu Lina Linear_A Linb Linear_B Lisu Lyci Lycian Lydi
Lydian Mahj Mahajani Maka Makasar Mand Mandaic Mani Manichaean Marc Marchen Medf Medefaidrin Mend
Mende_Kikakui Merc Meroitic_Cursive Mero Meroitic_Hieroglyphs Mlym Malayalam Modi Mong Mongolian Mroo Mro Mtei
Meetei_Mayek Mult Multani Mymr Myanmar Nagm Nag_Mundari Nand Nandinagari Narb Old_North_Arabian Nbat Nabataean
Newa Nkoo Nko Nshu Nushu Ogam Ogham Olck Ol_Chiki Onao Ol_Onal Orkh Old_Turkic Orya Oriya Osge Osage Osma
Osmanya Ougr Old_Uyghur Palm Palmyrene Pauc Pau_Cin_Hau Perm Old_Permic Phag Phags_Pa
Phli Inscriptional_Pahlavi Phlp Psalter_Pahlavi Phnx Phoenician Plrd Miao Prti Inscriptional_Parthian Rjng
Rejang Rohg Hanifi_Rohingya Runr Runic Samr Samaritan Sarb Old_South_Arabian Saur Saurashtra Sgnw
SignWriting Shaw Shavian Shrd Sharada Sidd Siddham Sidt Sidetic Sind Khudawadi Sinh Sinhala Sogd Sogdian Sogo
Old_Sogdian Sora Sora_Sompeng Soyo Soyombo Sund Sundanese Sunu Sunuwar Sylo Syloti_Nagri Syrc Syriac Tagb
Tagbanwa Takr Takri Tale Tai_Le Talu New_Tai_Lue Taml Tamil Tang Tangut Tavt Tai_Viet Tayo Tai_Yo Telu Telugu
Tfng Tifinagh Tglg Tagalog Thaa Thaana Thai Tibt Tibetan Tirh Tirhuta Tnsa Tangsa Todr Todhri Tols Tolong_Siki
Toto Tutg Tulu_Tigalari Ugar Ugaritic Vaii Vai Vith Vithkuqi Wara Warang_Citi Wcho Wancho Xpeo Old_Persian
Xsux Cuneiform Yezi Yezidi Yiii Yi Zanb Zanabazar_Square Zinh Inherited Zyyy Common Zzzz Unknown
Qaac Qaai""".split())  # (the last two: other short names of Coptic and Inherited)
# Script values the regex package reads that node's RegExp (V8; node 20's ICU holds Unicode 17) refuses with
# the u flag, as a JSON Schema validator that reads patterns with it does: Katakana_Or_Hiragana, which no
# character has (V8 never read it), and scripts encoded after Unicode 17. A schema's pattern with one is refused
# (ecma_problem), its characters offered as ranges where they are few.
_SCRIPTS_UNREAD = ("Hrkt", "Katakana_Or_Hiragana", "Jurc", "Jurchen", "Pcun", "Proto_Cuneiform", "Seal")
# Why \p{Script=Hrkt} holds nothing (the regex package's \p{Script=Hrkt} and \p{scx=Hrkt} hold no code point;
# tc39/ecma262#3590: every ECMAScript engine refuses scx=Hrkt), for hrkt_class, which offers the two scripts
_HRKT_WORDS = ("naming Katakana_Or_Hiragana (Hrkt, ISO 15924's code for Hiragana and Katakana together), a script "
               "Unicode gives no character, as Script or as Script_Extensions (a mark both use, U+30FC ー, has the "
               "extensions Hiragana and Katakana), and ")


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
    m = _CLASS.fullmatch(cls)
    if m is None:
        return False
    key, equals, value = m.group(2).partition("=")
    ecma = value in _VALUED.get(key, ()) if equals else key in ECMA_PROPERTY_NAMES  # (CWKCF: ECMA's alone)
    return not ecma and not _known(m.group(2)) and not automaton_reads(cls)


def closest_property(cls: str) -> Optional[str]:
    """The class of ECMA's property whose name is closest by ``difflib``, ignoring case, to that
    of the class ``cls`` (``\\p{Lettr}``: ``\\p{Letter}``), of the general categories for
    ``gc=Lettr``, of the scripts for ``Script=Greak`` (``\\p{Script=Greek}``), and of all of ECMA's
    names and the scripts for a name alone (``\\p{Greeek}``: ``\\p{Script=Greek}``, as ECMA writes a
    script), or None where none is close. ``\\p{^Lettr}``, the regex package's negation, which ECMA
    lacks, gives ``\\P{Letter}``."""
    m = _CLASS.fullmatch(cls)
    if m is None:
        return None
    key, equals, value = m.group(2).partition("=")
    key = key.strip()
    word = (value if equals else key).strip().lower()
    if equals:
        by_lower = {c.lower(): f"{key}={c}" for c in _VALUED.get(key, _SCRIPTS if key in _SCRIPT_KEYS else ())}
    else:  # (a script's name alone as ECMA writes it: Script=Greek)
        by_lower = {**{s.lower(): f"Script={s}" for s in _SCRIPTS}, **{c.lower(): c for c in ECMA_PROPERTY_NAMES}}
    # (a script's long name first: Greak is nearer Grek, Greek's short name, than Greek)
    close = close_match(word, [c for c in by_lower if len(c) > 4]) or close_match(word, by_lower)
    if close is None:
        return None
    letter = m.group(1) if not cls.startswith("{^", 2) else "P" if m.group(1) == "p" else "p"
    return f"\\{letter}{{{by_lower[close]}}}"


def ecma_problem(cls: str) -> Optional[tuple[str, Optional[str]]]:
    """Why ECMA 262 with the u flag (JSON Schema's dialect) refuses the property class ``cls``, one a
    regex dialect knows (not ``unknown_property``): (words that follow "a class \\p{...}", the class
    ECMA reads meant, or None where there is none); None where ECMA reads it. ECMA takes a name
    alone only of a general category or a binary property, a script only as ``Script=`` or
    ``Script_Extensions=`` (``sc=``, ``scx=``), each name case-sensitive, and no ``\\p{^...}``:
    ``\\p{Greek}``, ``\\p{IsGreek}`` (Perl's, Java's, .NET's) mean ``\\p{Script=Greek}``, ``\\p{lu}``
    ``\\p{Lu}``, ``\\p{^L}`` ``\\P{L}``; a block (``\\p{InGreek}``) has no such class. Hrkt, a script no
    character has, which ECMA's engines refuse, means the two scripts it is ISO 15924's code for:
    ``\\p{scx=Hrkt}``, ``[\\p{scx=Hiragana}\\p{scx=Katakana}]`` (none for ``\\P{...}``, whose ranges are
    every character's)."""
    m = _CLASS.fullmatch(cls)
    if m is None:
        return None
    letter, name, negated = m.group(1), m.group(2), cls.startswith("{^", 2)
    if not negated and _ecma_reads(name):
        return None
    spelled = _ecma_spelling(name)
    flipped = "P" if letter == "p" else "p"
    meant = spelled and f"\\{flipped if negated else letter}{{{spelled}}}"
    if negated:
        why = f"negated as the regex package negates, which ECMA lacks (it negates with \\{flipped})"
    elif spelled is None and (unread := _script(name.partition("=")[2] if "=" in name else _bare(name),
                                                _SCRIPTS_UNREAD)):
        hrkt = hrkt_class(cls) if unread in _SCRIPTS_UNREAD[:2] else None
        why = ((hrkt[0] if hrkt else "naming a script newer than the Unicode 17 node's RegExp reads, ")
               + "which node refuses (as a JSON Schema validator reading patterns with it does)")
        meant = hrkt and hrkt[1]
    elif spelled is None:
        why = ("naming no property ECMA reads (ECMA's: a general category, \\p{L}, a binary property, \\p{Alphabetic}, "
               "or a script, \\p{Script=Greek}; no block)")
    elif name[:2].lower() == "is" and spelled.lower() != name.lower():
        why = "with the prefix Is of Perl, Java and .NET, which ECMA lacks"
    elif spelled.startswith("Script=") and "=" not in name:
        why = "naming a script without Script=, which ECMA asks for"
    elif spelled.lower() == name.lower():
        why = "naming a property as ECMA does not spell it (its names are case-sensitive)"
    else:  # (\p{Script = Greek}, \p{Script=Old Italic}: the regex package reads such spellings)
        cased = re.sub(r"[ _-]", "", spelled) != re.sub(r"[ _-]", "", name)  # (\p{script = greek}: both)
        why = ("naming a property as ECMA does not spell it ("
               + ("its names are case-sensitive, and " if cased else "")
               + "no spaces or hyphens in its names: words join with _)")
    return why, meant


def hrkt_class(cls: str) -> Optional[tuple[str, Optional[str]]]:
    """(why it holds no character, words that follow "a class \\p{...}" and end ", and "; the class of
    the two scripts it is ISO 15924's code for, by the key written, ``[\\p{Script=Hiragana}\\p{Script=Katakana}]``,
    or None for ``\\P{...}``, whose ranges are every character's) for the class ``cls`` naming Hrkt
    (Katakana_Or_Hiragana) alone (``\\p{IsHrkt}`` too) or as a Script or Script_Extensions value, not
    negated with "^"; None for any other class. Shared by a schema's check (``ecma_problem``) and a
    ``regex=``'s (``regex_unicode_classes``), whose automaton library does not read it either. In a
    negated class the two scripts are no offer (``[^\\p{Hrkt}]`` is every character, as ``\\P{Hrkt}``
    is): ``negated_hrkt_ranges``."""
    m = _CLASS.fullmatch(cls)
    if m is None or cls.startswith("{^", 2):
        return None
    key, equals, value = m.group(2).partition("=")
    key = _folded(key.strip(), _SCRIPT_KEYS) if equals else "Script"
    if key is None or _script(value if equals else _bare(m.group(2)), _SCRIPTS_UNREAD[:2]) is None:
        return None
    return _HRKT_WORDS, (f"[\\p{{{key}=Hiragana}}\\p{{{key}=Katakana}}]" if m.group(1) == "p" else None)


# What a negated class is told that negated_hrkt_ranges finds matches no character ([^\P{Hrkt}]), by a schema's
# check and a regex='s alike
NEGATED_HRKT_NOTHING = ("Hrkt holding no character, \\P{{Hrkt}} is every character and the class {negated} matches "
                        "none: write the class you meant")


def negated_hrkt_ranges(negated: str, ecma: bool = False) -> Optional[str]:
    """The negated class ``negated`` (``[^\\p{Hrkt}a]``), which holds a class naming Hrkt
    (``hrkt_class``), as code-point ranges (``json_schema.as_ranges``; ``ecma`` as there), read as
    ``\\P{Hrkt}`` is offered: as the regex package reads it, Hrkt holding no character, so
    ``[^\\p{Hrkt}]`` is every character (``[\\u0000-\\ud7ff\\ue000-\\U0010ffff]``, ``\\P{Hrkt}``'s
    offer); "" where it so matches no character (``[^\\P{Hrkt}]``: ``NEGATED_HRKT_NOTHING``); None
    where it has no such spelling (the package does not read it, or more than ``MAX_SPELLED_RANGES``
    ranges)."""
    runs = code_point_runs(negated)
    if runs is None:
        return None
    return as_ranges(negated, ecma) if without_surrogates(runs) else ""


def _ecma_reads(name: str) -> bool:
    """Whether ECMA with the u flag reads ``\\p{name}`` (``ecma_problem``)."""
    key, equals, value = name.partition("=")
    if not equals:
        return name in ECMA_PROPERTY_NAMES
    if key in _VALUED:
        return value in _VALUED[key]
    return key in _SCRIPT_KEYS and value in _SCRIPTS


def _ecma_spelling(name: str) -> Optional[str]:
    """``name`` (of ``\\p{name}``) as ECMA spells the property meant (``ecma_problem``), or None."""
    key, equals, value = name.partition("=")
    if equals:
        key = _folded(key.strip(), (*_VALUED, *_SCRIPT_KEYS))
        value = key and (_folded(value.strip(), _VALUED[key]) if key in _VALUED else _script(value.strip()))
        return value and f"{key}={value}"
    bare = _bare(name)
    found = _folded(name, ECMA_PROPERTY_NAMES) or _folded(bare, ECMA_PROPERTY_NAMES)
    return found or ((script := _script(bare)) and f"Script={script}")


def _bare(name: str) -> str:
    """``name`` (of ``\\p{name}``, no "=") without the prefix Is of Perl, Java and .NET (``IsGreek``)."""
    return name[2:] if name[:2].lower() == "is" else name


def _folded(word: str, names: tuple[str, ...]) -> Optional[str]:
    """The one of ``names`` that is ``word`` but for letter case, spaces, hyphens and "_" (as the
    regex package reads ``\\p{White Space}``: ``White_Space``), or None."""
    loose = re.sub(r"[ _-]", "", word).lower()
    return next((n for n in names if re.sub(r"[ _-]", "", n).lower() == loose), None)


def _script(word: str, scripts: tuple[str, ...] = _SCRIPTS) -> Optional[str]:
    """The script ``word`` names as ECMA spells it (``scripts``; ``greek``, ``Old Italic``: ``Greek``,
    ``Old_Italic``), letter case, spaces, hyphens and "_" aside, or None."""
    loose = re.sub(r"[ _-]", "", word).lower()
    return next((s for s in scripts if s.replace("_", "").lower() == loose), None)
