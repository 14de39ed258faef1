"""lmnb — the language: SGLang-style LM programs (paper §2).

``import lmnb as sgl`` runs SGLang frontend programs unchanged: the same primitives (``gen``,
``select``, roles, ``fork``/``join``), the same ``@function`` / ``run`` / ``run_batch``, and the
backends ``Engine`` / ``Runtime`` (in-process lmnb engine), ``RuntimeEndpoint`` (SGLang's native
HTTP protocol, e.g. ``lmnb serve``) and ``OpenAI`` (any OpenAI-compatible API).

Importing lmnb loads neither torch nor the engine: backends are imported when first named.
"""

from importlib.metadata import PackageNotFoundError as _PackageNotFoundError
from importlib.metadata import version as _version

from lmnb.api import (
    SglFunction,
    assistant,
    assistant_begin,
    assistant_end,
    flush_cache,
    function,
    gen,
    gen_int,
    gen_string,
    get_default_backend,
    get_server_info,
    global_config,
    image,
    select,
    set_default_backend,
    system,
    system_begin,
    system_end,
    user,
    user_begin,
    user_end,
    video,
)
from lmnb.backend.base import BackendError
from lmnb.chat_template import ChatTemplate, get_chat_template
from lmnb.choices import (
    greedy_token_selection,
    token_length_normalized,
    unconditional_likelihood_normalized,
)
from lmnb.executor import ForkError, ProgramAborted, ProgramError, ProgramEvent, UnjoinedForkError, observe
from lmnb.interpreter import ProgramState, ProgramStateGroup

try:  # SGLang has sgl.__version__; programs print or compare it
    __version__ = _version("lmnb")
except _PackageNotFoundError:  # (run from a source tree that was never installed)
    __version__ = "0+unknown"

# name -> module; resolved on first access so that `import lmnb` stays light.
_LAZY = {
    "Engine": "lmnb.backend.engine",
    "Runtime": "lmnb.backend.engine",
    "RuntimeEndpoint": "lmnb.backend.runtime_endpoint",
    "OpenAI": "lmnb.backend.openai",
}


# SGLang frontend names lmnb does not have -> what to use instead.
_NOT_IN_LMNB = {
    "Anthropic": "lmnb's backends are Engine, RuntimeEndpoint and OpenAI; reach other APIs through an "
                 "OpenAI-compatible proxy (LiteLLM's) with lmnb.OpenAI(model, base_url=...)",
    "separate_reasoning": "a reasoning model's text is not split here; cut it at the model's end-of-thinking "
                          "marker in Python",
}
_NOT_IN_LMNB["VertexAI"] = _NOT_IN_LMNB["LiteLLM"] = _NOT_IN_LMNB["Anthropic"]


def __getattr__(name):
    if name == "template":  # the %%lm cell language (`lmnb.template.parse(cell).to_python()`)
        import importlib

        return importlib.import_module("lmnb.template")
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    if name in _NOT_IN_LMNB:
        raise AttributeError(f"lmnb has no {name} (an SGLang name it does not support): {_NOT_IN_LMNB[name]}")
    raise AttributeError(f"module 'lmnb' has no attribute {name!r}")


__all__ = [
    "__version__",
    "ChatTemplate",
    "Engine",
    "ForkError",
    "OpenAI",
    "BackendError",
    "ProgramAborted",
    "ProgramError",
    "ProgramEvent",
    "ProgramState",
    "ProgramStateGroup",
    "Runtime",
    "RuntimeEndpoint",
    "SglFunction",
    "UnjoinedForkError",
    "assistant",
    "assistant_begin",
    "assistant_end",
    "flush_cache",
    "function",
    "gen",
    "gen_int",
    "gen_string",
    "get_chat_template",
    "get_default_backend",
    "get_server_info",
    "global_config",
    "greedy_token_selection",
    "image",
    "observe",
    "select",
    "set_default_backend",
    "system",
    "system_begin",
    "system_end",
    "token_length_normalized",
    "unconditional_likelihood_normalized",
    "user",
    "user_begin",
    "user_end",
    "video",
]
