"""lmnb_engine — in-process inference runtime with RadixAttention (SGLang paper §3–4).

``Engine`` is imported lazily so that ``import lmnb_engine`` stays cheap (no torch, no model code).
"""

from lmnb_engine.outputs import FinishReason, GenerateResult, RequestMeta, StreamEvent, TokenLogprob
from lmnb_engine.params import SamplingParams

__all__ = ["Engine", "FinishReason", "GenerateResult", "RequestMeta", "SamplingParams", "StreamEvent", "TokenLogprob"]


def __getattr__(name: str):
    if name == "Engine":
        from lmnb_engine.engine import Engine

        return Engine
    raise AttributeError(f"module 'lmnb_engine' has no attribute {name!r}")
