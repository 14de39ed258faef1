"""lmnb_engine — in-process inference runtime with RadixAttention (SGLang paper §3–4).

``Engine`` is imported lazily so that ``import lmnb_engine`` stays cheap (no torch, no model code).
"""

import os
from typing import Optional

from lmnb_engine.outputs import FinishReason, GenerateResult, RequestMeta, StreamEvent, TokenLogprob
from lmnb_engine.params import SamplingParams

__all__ = ["API_KEY_ENV", "DEMO_MODEL_NAME", "MODEL_ENV", "Engine", "FinishReason", "GenerateResult", "RequestMeta", "SamplingParams", "StreamEvent",
           "TokenLogprob", "is_demo_name", "model_or_env"]

# The environment variable that names the model of every front end given none (``lmnb serve``,
# ``%lm load``, batch jobs); tests and CI point it at a local checkpoint. Defined here, at the
# bottom of the import chain, so that all three read one name.
MODEL_ENV = "LMNB_MODEL"


# The environment variable that the client front ends (batch jobs, ``%lm connect``) read the API key
# of an SGLang-protocol server from when none is given, and ``lmnb serve`` its own key from without
# ``--api-key``: a key on the command line shows in ``ps`` and the shell's history. OpenAI-compatible servers keep the openai
# client's ``$OPENAI_API_KEY`` (this one would go to the official API too).
API_KEY_ENV = "LMNB_API_KEY"


# The built-in demo model's name, which every front end takes for it (``%lm load demo``, ``lmnb serve
# --model demo``, ``lmnb.Engine("demo")``), as it takes no model; a local path "demo" is that path.
DEMO_MODEL_NAME = "demo"


def is_demo_name(model: object) -> bool:
    """Whether ``model`` is ``DEMO_MODEL_NAME`` with no file or folder of that name where it is read."""
    return model == DEMO_MODEL_NAME and not os.path.exists(model)


def model_or_env(model: Optional[str] = None) -> Optional[str]:
    """``model``, else ``$LMNB_MODEL``; None (the built-in demo model) when neither names one, or
    the one named is the demo model's name (``is_demo_name``)."""
    model = model or os.environ.get(MODEL_ENV) or None
    return None if is_demo_name(model) else model


def __getattr__(name: str):
    if name == "Engine":
        from lmnb_engine.engine import Engine

        return Engine
    raise AttributeError(f"module 'lmnb_engine' has no attribute {name!r}")
