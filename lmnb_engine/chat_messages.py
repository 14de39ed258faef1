"""Checks of OpenAI-style chat messages (``{"role": ..., "content": ...}``), shared by the server's
``/v1/chat/completions`` and ``Engine.apply_chat_template`` so both refuse a bad message alike.
Importing it loads nothing heavy."""

from __future__ import annotations

from typing import Any, Iterable, Optional

from lmnb_engine.json_schema import json_value


def missing_content(index: int, role: Any, content: Any, other_keys: Iterable[str]) -> Optional[str]:
    """Why message ``index`` (its ``role``, its ``content``, None when left out, and the names of its
    keys other than role, content and name) cannot be rendered, or None when it can.

    A message without content would be rendered as empty text, losing what was meant (often a key
    misspelt, ``"contents"``: OpenAI answers 400 there). Only an assistant message that carries
    ``tool_calls`` or ``function_call`` may leave content out, as OpenAI's API allows.
    """
    others = list(other_keys)
    if content is not None or (role == "assistant" and ("tool_calls" in others or "function_call" in others)):
        return None
    has = f" (it has {', '.join(map(json_value, others))})" if others else ""
    return (f'messages[{index}] has no content{has}: give its text as "content": "..." (a string, or a '
            "list of text parts)")
