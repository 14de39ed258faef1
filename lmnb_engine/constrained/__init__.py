"""Constrained decoding: regex and JSON-schema token masks, compressed FSM, jump-forward (paper §4).

Pipeline: a request's ``regex`` or ``json_schema`` (dict, JSON string or pydantic class) is
validated at submission (``GrammarBackend.to_regex``: unsupported regex features and schema
keywords raise ``GrammarError`` naming them), compiled once per (pattern, tokenizer) on a worker
thread into an outlines-core token index (``GrammarBackend.submit`` → ``Future``), and walked per
request by a ``GrammarMatcher``. The sampler applies the matcher's packed bitmask to the logits
(``apply_token_bitmask_``); the compressed FSM's forced strings become jump-forward drafts that the
engine verifies in one extend (``jump_forward``), so output is the same with jump-forward on or off.

Semantics (the rules users see):

* **End of a constrained output.** EOS ids are allowed only where the text so far fully matches.
  The output is finished when EOS is sampled there, or as soon as the text is a full match that no
  other token can extend (nothing else is allowed). The EOS token is not part of the text.
  ``ignore_eos`` does not apply to constrained requests.
* **Stop strings and stop token ids apply** as on unconstrained requests (SGLang's and OpenAI's
  behaviour): a ``stop`` string can end a constrained output before it matches in full (finish
  reason ``stop`` with ``matched`` set; the stop text is not returned), and a ``stop_token_ids``
  token the grammar allows ends it. Such requests decode without jump-forward, because a forced
  string would skip the per-token stop checks. The lmnb language adds the chat template's stop
  strings to unconstrained gens only, so they never cut a JSON value.
* **Token limit.** If ``max_new_tokens`` (or the context length) runs out before the text is a
  full match, the finish reason is ``length`` with the message ``INCOMPLETE_MESSAGE``; the partial
  text is returned as is. A full match cut by the limit has no message.
* **Jump-forward** changes only the number of forward passes, never the tokens (greedy output is
  identical with it on or off; sampled output has the same distribution). Requests with
  frequency/presence/repetition penalties or ``min_new_tokens`` decode without it (their logits
  at a draft position would depend on the draft), and so do requests with stops (see above);
  requests asking for logprobs verify every draft
  token, so each token has its real logprob. ``Engine(disable_jump_forward=True)`` turns it off.
* **JSON whitespace.** Between JSON tokens the default grammar allows one optional space
  (outlines-core's ``[ ]?``); ``SamplingParams.extra["whitespace_pattern"]`` changes it (``""``
  for compact JSON, ``r"[ \\n]{0,2}"`` for some line breaks).
* **Character classes** ``\\d``, ``\\w``, ``\\s`` are Unicode-aware and hold what Python's ``re``
  gives them (``regex_syntax.python_category``; the DFA's own tables differ); write ``[0-9]`` for
  ASCII digits.
"""

import importlib

# Each public name and its module, imported on first use (PEP 562): the package's torch-free
# modules (regex_syntax, regex_check, vocab) load without torch, which grammar and masks import;
# the %%lm view respells a regex with regex_syntax as the engine does.
_MODULE_OF = {
    "GrammarBackend": "cache", "GrammarCache": "cache",
    "GrammarCompileStopped": "errors", "GrammarError": "errors",
    "CompiledGrammar": "grammar", "bitmask_width": "grammar", "compile_grammar": "grammar",
    "apply_token_bitmask_": "masks", "full_bitmask": "masks",
    "GrammarMatcher": "matcher",
    "check_regex": "regex_check",
    "INCOMPLETE_MESSAGE": "request_grammar", "RequestGrammar": "request_grammar",
    "schema_to_regex": "schema",
    "TokenVocabulary": "vocab",
}


def __getattr__(name: str):
    if name in _MODULE_OF:
        return getattr(importlib.import_module(f"{__name__}.{_MODULE_OF[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    """The module's names with the public ones not yet imported (PEP 562), so that ``dir()`` and a
    notebook's tab completion list them as they did when the package imported them all."""
    return sorted(set(globals()) | set(_MODULE_OF))


__all__ = sorted(_MODULE_OF)
