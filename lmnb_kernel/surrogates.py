"""Sending text with lone surrogates to Jupyter: no UTF-8 carries one (``print("\\ud800")``), and a
jupyter_client ``Session`` raised ``UnicodeEncodeError`` in its packer, in the IO thread, which
printed a traceback and lost the output. ``surrogate_safe`` wraps the packer so such a message goes
out with each lone surrogate replaced by U+FFFD; the ``lmnb`` kernel wraps its session with it, and
so does the extension loaded into any other IPython kernel (``%load_ext lmnb_kernel``).
"""

from __future__ import annotations


def surrogate_safe(pack):
    """``pack`` (a jupyter_client ``Session``'s message packer), but a message whose text holds a
    lone surrogate is sent with each replaced by U+FFFD, where the packer raised."""

    def safe_pack(obj):
        try:
            return pack(obj)
        except UnicodeEncodeError:
            return pack(_without_surrogates(obj))

    safe_pack.surrogate_safe = True  # (so a session is wrapped once)
    return safe_pack


def make_session_surrogate_safe(session):
    """Wrap ``session.pack`` with ``surrogate_safe`` unless it is wrapped already; the packer it
    replaced, or None."""
    if getattr(session.pack, "surrogate_safe", False):
        return None
    pack, session.pack = session.pack, surrogate_safe(session.pack)
    return pack


def _without_surrogates(obj):
    """``obj`` with every string's lone surrogates replaced by U+FFFD; a high surrogate followed by
    a low one is the character the pair stands for (UTF-16 decodes it so)."""
    if isinstance(obj, str):
        return obj.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    if isinstance(obj, dict):
        return {_without_surrogates(k): _without_surrogates(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_without_surrogates(v) for v in obj]
    return obj
