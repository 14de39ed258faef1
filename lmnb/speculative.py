"""API speculative execution (paper §2 and §6): fewer calls to an API that bills per call.

For models served only through an API, a program's consecutive ``gen`` calls each cost a request.
With ``@function(num_api_spec_tokens=N)`` one call generates past the first ``gen`` and later fills
and gens are matched from that text. Completion models follow SGLang's ``StreamExecutor._spec_gen``;
chat models defer the gens of an assistant role to one call at the role's end and split the
reply along the role's pattern (SGLang's ``OpenAI.role_end_generate``/``spec_pattern_match``),
keeping the state per program instead of per backend so ``run_batch`` threads do not mix.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Optional

from lmnb.ir import Gen, GenParams

if TYPE_CHECKING:
    from lmnb.executor import StreamExecutor

SPEC_MAX_TRIES = 3  # chat models: calls before giving up on a pattern (SGLang's)


def spec_gen(ex: "StreamExecutor", params: GenParams, expr: Gen) -> tuple[str, dict]:
    """Completion-model API speculative execution (SGLang's ``_spec_gen``): one call generates
    ``max(max_new_tokens, num_api_spec_tokens)`` tokens without the gen's stops; this gen takes
    the text up to its first stop, and the rest is kept for later fills and gens that match."""
    stops = params.stop_list

    def first_stop(text: str) -> int:
        hits = [i for i in (text.find(s) for s in stops) if i >= 0]
        return min(hits) if hits else -1

    pos = first_stop(ex.speculated_text) if ex.speculated_text else -1
    meta: dict = {"speculative": True}
    if pos < 0:
        spec = dataclasses.replace(
            params,
            max_new_tokens=max(params.max_new_tokens or 0, ex.num_api_spec_tokens),
            stop=list(ex.chat_template.stop_str),
        )
        comps = ex._call(ex.backend.generate, ex._prompt(), spec)
        ex._check_finish(comps[0].meta_info, expr)
        ex.speculated_text = comps[0].text
        meta = dict(comps[0].meta_info, speculative=True)
        pos = first_stop(ex.speculated_text)
    if pos < 0:
        text, ex.speculated_text = ex.speculated_text, ""
    else:
        text, ex.speculated_text = ex.speculated_text[:pos], ex.speculated_text[pos:]
    return text, meta


def spec_role_end(ex: "StreamExecutor") -> None:
    """Chat-model API speculative execution: the assistant role's gens were deferred; one chat
    call (``max_tokens=num_api_spec_tokens``) answers them all, and its reply is matched
    against the role's pattern of fills and gens (up to ``SPEC_MAX_TRIES`` calls)."""
    terms, ex._spec_terms = ex._spec_terms, []
    gens = [t for t in terms if t[0] == "gen"]
    values = None
    if gens:
        params = dataclasses.replace(
            gens[0][2], max_new_tokens=ex.num_api_spec_tokens, stop=list(ex.chat_template.stop_str)
        )
        reply, meta = "", {}
        for _ in range(SPEC_MAX_TRIES):
            comps = ex._call(ex.backend.generate, ex._prompt(), params)
            reply, meta = comps[0].text, comps[0].meta_info
            ex._check_finish(meta, gens[0][1])
            values = spec_match(terms, reply)
            if values is not None:
                break
        if values is None:
            raise ValueError(
                f"API speculative execution: after {SPEC_MAX_TRIES} calls the reply {reply[:200]!r} "
                "does not follow the assistant role's pattern of text and gens; raise "
                "num_api_spec_tokens, add stop strings, or turn speculative execution off"
            )
    vi = iter(values or [])
    for term in terms:
        if term[0] == "text":
            ex._append(term[1], "fill")
        else:
            _, expr, _, parse = term
            text = next(vi)
            ex._append(text, "gen", expr.name)
            ex._finish_var(expr.name, ex._parsed(expr, text, parse), dict(meta, speculative=True))


def spec_match(terms: list[tuple], reply: str) -> Optional[list[str]]:
    """Split a speculative chat reply along an assistant role's fills and gens.

    Fills must appear verbatim in order (SGLang's ``spec_pattern_match``); a gen takes the text up
    to its first stop string — or, without one, up to the next fill — and the last gen may take
    the rest. Returns the gen values, or None when the reply does not follow the pattern.
    """
    values, rest = [], reply
    for k, term in enumerate(terms):
        if term[0] == "text":
            if not rest.startswith(term[1]):
                return None
            rest = rest[len(term[1]):]
            continue
        hits = [i for i in (rest.find(s) for s in term[2].stop_list) if i >= 0]
        following = next((t[1] for t in terms[k + 1:] if t[0] == "text" and t[1]), None)
        if not hits and following is not None and following in rest:
            hits = [rest.find(following)]
        if hits:
            pos = min(hits)
        elif following is None and all(t[0] == "text" for t in terms[k + 1:]):
            pos = len(rest)
        else:
            return None
        values.append(rest[:pos])
        rest = rest[pos:]
    return values
