"""What the engine's automaton library (Rust's regex, in outlines-core) reads a character class as, asked
of the library itself: whether it builds a Unicode property class (``automaton_reads``: ``\\p{Greek}``
yes, ``\\p{InGreek}`` no) and whether a class holds no character to it (``automaton_matches_nothing``:
``[\\s&&\\S]``). Each answer is cached; outlines-core (torch-free) is imported only when one is asked.
"""

from __future__ import annotations

import functools


@functools.lru_cache(maxsize=256)
def automaton_matches_nothing(cls: str) -> bool:
    """Whether the automaton library reads the character class ``cls`` (``[\\s&&\\S]``) as holding no
    character: its automaton over every single byte has no transition from the start (a class with
    a character has the first byte of its UTF-8). False where the library refuses ``cls`` otherwise."""
    from outlines_core import Index, Vocabulary  # (torch-free)

    try:
        Index(cls, Vocabulary(256, {bytes([b]): [b] for b in range(256)}))
    except ValueError as e:
        return "no transitions" in str(e)
    return False


@functools.lru_cache(maxsize=256)
def automaton_reads(cls: str) -> bool:
    """Whether the automaton library builds the Unicode class ``cls`` (``\\p{Greek}``): a few
    milliseconds at most, once per class. Offered beside ``a`` and a vocabulary of ``a`` alone, so
    that only the class can fail the build, not the vocabulary."""
    from outlines_core import Index, Vocabulary  # (torch-free)

    try:
        Index(f"(?:{cls}|a)", Vocabulary(0, {b"a": [1]}))
    except ValueError:
        return False
    return True
