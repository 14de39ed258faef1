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

from lmnb_engine.constrained.cache import GrammarBackend, GrammarCache
from lmnb_engine.constrained.errors import GrammarCompileStopped, GrammarError
from lmnb_engine.constrained.grammar import CompiledGrammar, bitmask_width, compile_grammar
from lmnb_engine.constrained.masks import apply_token_bitmask_, full_bitmask
from lmnb_engine.constrained.matcher import GrammarMatcher
from lmnb_engine.constrained.regex_check import check_regex
from lmnb_engine.constrained.request_grammar import INCOMPLETE_MESSAGE, RequestGrammar
from lmnb_engine.constrained.schema import schema_to_regex
from lmnb_engine.constrained.vocab import TokenVocabulary

__all__ = [
    "CompiledGrammar",
    "GrammarBackend",
    "GrammarCache",
    "GrammarCompileStopped",
    "GrammarError",
    "GrammarMatcher",
    "INCOMPLETE_MESSAGE",
    "RequestGrammar",
    "TokenVocabulary",
    "apply_token_bitmask_",
    "bitmask_width",
    "check_regex",
    "compile_grammar",
    "full_bitmask",
    "schema_to_regex",
]
