"""The word every "did you mean" of lmnb and lmnb_engine offers for a misspelt one.

Standard library only, so that every front end (the Python API, cells, command lines, the server)
can import it without loading the engine.
"""

from __future__ import annotations

import difflib
from typing import Iterable, Optional


def close_match(word: str, options: Iterable[str]) -> Optional[str]:
    """The one of ``options`` closest to a misspelt ``word`` (difflib's ``get_close_matches``: a
    similarity ratio of 0.6 or more, as Python's own "Did you mean" picks), or None where none is
    close: a ``%%lm`` cell's variable, the Python API's keywords, ``%lm`` subcommands, the export's
    notes on row fields, command-line options (``cli_options.suggest_option``), ``SamplingParams``
    fields, the server's fields and routes, ECMA property names (``regex_properties``)."""
    close = difflib.get_close_matches(word, list(options), n=1)
    return close[0] if close else None
