"""The least KV pool a front end that makes an engine takes (``lmnb.Engine``, so ``%lm load`` and
an exported job, and ``lmnb serve``): one that cannot hold one gen of the default ``max_tokens``
made every gen without a small ``max_tokens`` of its own fail, request after request."""

from __future__ import annotations

from typing import Any, Optional

from lmnb_engine.cli_options import option_error
from lmnb_engine.request import kv_to_finish


def pool_to_make(asked: Any) -> Any:
    """The ``max_total_tokens`` to make the engine with for ``asked``: an int below the engine's
    own floor of 2 as 2, so that ``refuse_a_pool_too_small``'s message, not the engine's "2 or
    more", names the least pool; anything else as it is (the engine checks it)."""
    return 2 if type(asked) is int and asked < 2 else asked


def refuse_a_pool_too_small(engine: Any, asked: Optional[int], max_tokens: int) -> None:
    """Shut ``engine`` (an ``lmnb_engine.Engine`` the caller made) down and raise ``ValueError``
    if its KV pool (``asked``, the ``max_total_tokens`` given, where one was) cannot hold one gen of
    lmnb's default ``max_tokens`` (``max_tokens``, 128) after a one-character prompt (with the BOS
    its tokenizer adds), or, where the model's context is shorter, a request of the whole context;
    a request holds a slot per token but the last it samples (``request.kv_to_finish``, as the
    engine's own check counts them).
    The engine itself takes any pool of 2 tokens or more (a prompt token and a new one): a tiny
    pool is how its eviction is tested. A pool this small on purpose (every gen with a small
    ``max_tokens``) is had by passing such an engine to ``lmnb.Engine(engine=...)``, which is not
    checked; the message says so (a command line, with no ``engine=`` option, drops that fix).

    Raises:
        ValueError: the pool is below the least, which the message names (``option_error``).
    """
    info = engine.model_info()
    pool = info["max_total_tokens"] if asked is None else asked
    problem = _too_small(pool, len(engine.encode("a")), info["context_len"], max_tokens)
    if problem is not None:
        engine.shutdown()
        raise problem


def refuse_a_pool_too_small_to_load(asked: Optional[int], max_tokens: int, model: Any = None, device: Any = None,
                                    dtype: Any = None, random_weights: bool = False) -> None:
    """``refuse_a_pool_too_small``'s check of a ``max_total_tokens`` given (``asked``; None passes)
    before the engine of ``model`` (``load_model``'s arguments) is made: from the checkpoint's
    tokenizer and config alone (``model_loader.tokenizer_and_config``), which take no device
    memory. For a caller that frees memory for the load (the kernel's ``%lm load`` onto the GPU its
    old engine holds), so that a pool too small is told while the old engine is still there.
    Imports torch (``model_loader``).

    Raises:
        ValueError: the pool is below the least (``refuse_a_pool_too_small``'s message); the
            errors of ``model_loader.check_model`` for a checkpoint that cannot be read.
    """
    if asked is None:
        return
    from lmnb_engine.model_loader import tokenizer_and_config
    from lmnb_engine.tokenizer import encode_text

    tokenizer, config = tokenizer_and_config(model, device, dtype, random_weights)
    problem = _too_small(asked, len(encode_text(tokenizer, "a")), config.context_len, max_tokens)
    if problem is not None:
        raise problem


def _too_small(pool: int, prompt: int, context_len: int, max_tokens: int) -> Optional[ValueError]:
    """The ``ValueError`` for a KV pool of ``pool`` tokens where a one-character prompt is
    ``prompt`` tokens and the model's context ``context_len`` (``refuse_a_pool_too_small``), or
    None where the pool holds the least."""
    least = kv_to_finish(prompt, min(context_len, prompt + max_tokens) - prompt)
    if pool >= least:
        return None
    return option_error(ValueError, f"a KV pool of {pool} token{'s' * (pool != 1)} cannot hold one gen of lmnb's default max_tokens "
                        f"({max_tokens}) after a one-character prompt ({prompt} token{'s' * (prompt != 1)})",
                        ("pass {} or more", "max_total_tokens", least),
                        # (the Python API's alone: no command line has an engine= option, so theirs drop it;
                        # the engine's own floor is 2)
                        (f"pass {{}}=lmnb_engine.Engine(..., max_total_tokens={max(pool, 2)}) for a pool this "
                         "small on purpose", "engine", None))
