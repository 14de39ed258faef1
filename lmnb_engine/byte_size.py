"""Sizes in bytes as messages and views show them, in IEC binary units (1 KiB = 1024 bytes).

Memory errors said sizes in GiB alone, so a pool of a few KiB read "(0.0 GiB)"; each size now
takes the largest unit it fills.
"""

from __future__ import annotations

_UNITS = ("KiB", "MiB", "GiB")  # (GiB at most: accelerators and RAM are sold and reported in it)


def byte_size(n: float) -> str:
    """``n`` bytes (an int or a float, of at most about 1e308: a float must hold it) in the largest
    unit that keeps it at 1 or more, to one decimal: ``512 -> "512 B"``, ``1536 -> "1.5 KiB"``,
    ``3 * 2**20 -> "3.0 MiB"``, ``5 * 2**40 -> "5120.0 GiB"``. A size that rounds to 1024 of its
    unit is written in the next one (``2**20 - 1 -> "1.0 MiB"``, not "1024.0 KiB").

    Raises ``OverflowError`` for an int too large for a float."""
    if round(abs(n)) < 1024:  # (a float of 1023.6 bytes is "1.0 KiB", not "1024 B")
        return f"{n:.0f} B"
    value = float(n)
    for unit in _UNITS:
        value /= 1024
        if round(abs(value), 1) < 1024:
            break
    return f"{value:.1f} {unit}"
