"""The exceptions of constrained decoding."""

from __future__ import annotations

from lmnb_engine.regex_python_error import shown_regex


class GrammarError(ValueError):
    """A regex or JSON schema that cannot drive constrained decoding.

    Raised at submission (or when the request's compile future resolves) with a message that names
    the unsupported feature, keyword or missing vocabulary piece and says how to fix the pattern.
    A ``ValueError`` so callers that validate request parameters catch it with the others.
    """


class GrammarCompileStopped(GrammarError):
    """A compile that ran out of time or memory, or whose process died or was stopped.

    Not the pattern's fault alone (a busy machine can make a compile miss its time limit), so it is
    not cached: asking again compiles again. ``by_shutdown``: the grammar backend that started it
    shut down (another engine sharing the cache then compiles the pattern itself). ``transient``:
    the pattern had no part in it (a shutdown, a busy compiler, a crashed process), so the same
    request may well succeed later; a compile over its time or memory limit is not transient.
    """

    def __init__(self, message: str, by_shutdown: bool = False, transient: bool = False):
        super().__init__(message)
        self.by_shutdown = by_shutdown
        self.transient = transient or by_shutdown

    @classmethod
    def for_shutdown(cls, regex: str) -> "GrammarCompileStopped":
        """The error of a constraint that was not compiled because its engine shut down first."""
        return cls(f"the constraint {shown_regex(regex)} was not compiled: the engine shut down", by_shutdown=True)
