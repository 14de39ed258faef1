"""API speculative execution (paper §2 and §6): fewer calls to an API that bills per call.

For models served only through an API, a program's consecutive ``gen`` calls each cost a request.
With ``@function(num_api_spec_tokens=N)`` one call generates past the first ``gen`` and later fills
and gens are matched from that text. Completion models follow SGLang's ``StreamExecutor._spec_gen``;
chat models defer the gens of an assistant role to one call at the role's end, made with the first
gen's sampling parameters (a later gen whose own differ is refused: ``spec_role_check``; so is a
constrained gen beside text or another gen: ``spec_role_constraint_check``), and split
the reply along the role's pattern (SGLang's ``OpenAI.role_end_generate``/``spec_pattern_match``),
keeping the state per program instead of per backend so ``run_batch`` threads do not mix; each gen's
share is then cut at its own max_tokens and reports its own tokens, as a completion model's gen does
(``_role_share``; SGLang does neither).
"""

from __future__ import annotations

import bisect
import codecs
import dataclasses
import re
import threading
import weakref
from typing import TYPE_CHECKING, Callable, Optional

from lmnb.backend.base import BackendError, finish_reason_dict, reworded
from lmnb.ir import GEN_NAMES, Gen, GenParams, shown_value

if TYPE_CHECKING:
    from lmnb.executor import StreamExecutor

SPEC_MAX_TRIES = 3  # chat models: calls before giving up on a pattern (SGLang's)
_BYTE_ESCAPE = re.compile(r"\\x([0-9a-fA-F]{2})")


@dataclasses.dataclass(frozen=True)
class Speculation:
    """A completion-model speculation left over: ``text`` not yet used by a fill or gen, and
    ``ends``, the character offset in ``text`` where each of its tokens ends (None when the
    backend gave no per-token text, or it did not add up to ``text``); a token that adds no text
    (a special token the text skips) ends where the one before it ends. ``ignore_eos``: the call
    went on past EOS, so its text serves only gens that do too. ``logprobs``: the call's
    ``output_token_logprobs`` and ``output_top_logprobs`` entries of the tokens of ``ends`` (key
    to a tuple as long as ``ends``), so that a gen served later reports its own tokens' logprobs.
    ``follows``: what the call wrote after ``text``: "" where its output ended there (an EOS or a
    stop token), the stop string it stopped at, None where more text would follow (its max
    tokens) or it is not known; a ``stop_regex`` match that reads the text's end (``a$``) is a
    stop only where what follows settles it (``_stop_in``). ``logit_bias``: the call's (None for
    none): its text was drawn with that bias, so it serves only gens with the same."""

    text: str = ""
    ends: Optional[tuple[int, ...]] = None
    ignore_eos: bool = False
    logit_bias: Optional[dict] = None
    logprobs: dict = dataclasses.field(default_factory=dict, compare=False)
    follows: Optional[str] = None

    @classmethod
    def from_completion(cls, text: str, meta: dict,
                        token_text: Optional[Callable[[int], str]] = None) -> "Speculation":
        """The speculation of one completion call: its ``text`` and, when ``meta`` holds per-token texts
        that add up to it (special tokens the text skips aside), the character offsets where its
        tokens end (else None). A token text holding U+FFFD (a token that is part of a character,
        as the engine and SGLang's native API write it) is replaced by ``token_text(token_id)``
        where given (``bytes:\\xc3``, the backend's own reading of its bytes): U+FFFD says
        neither how many bytes the token holds nor which token completes the character."""
        tokens = meta.get("output_token_logprobs") or []
        pieces = [t[2] for t in tokens if isinstance(t, (list, tuple)) and len(t) > 2 and isinstance(t[2], str)]
        if len(pieces) != len(tokens):
            return cls(text, None)
        if token_text is not None:
            pieces = [token_text(t[1]) if "\ufffd" in p and isinstance(t[1], int) else p
                      for t, p in zip(tokens, pieces)]
        pieces = _token_texts(pieces)
        ends, pos = [], 0
        for piece in pieces:
            if pos == len(text):  # the tokens may go on past the text: a stop string matched in them
                break
            if text.startswith(piece, pos) or piece.startswith(text[pos:]):
                pos = min(pos + len(piece), len(text))
            # else a token the text skips (a special token such as "</s>" generated under ignore_eos):
            # it adds no text but still counts towards max_tokens, as it does without speculation
            ends.append(pos)
        if pos < len(text):  # (byte tokens shown as "\ufffd" do not add up to the text)
            return cls(text, None)
        logprobs = {key: tuple(meta[key][: len(ends)]) for key in ("output_token_logprobs", "output_top_logprobs")
                    if isinstance(meta.get(key), list) and len(meta[key]) >= len(ends)}
        return cls(text, tuple(ends), logprobs=logprobs)

    def drop(self, n: int) -> "Speculation":
        """What is left after the first ``n`` characters are used: the tokens after the one that
        wrote the n-th character (a token cut in two, by a stop or a fill, stays with its logprobs).
        Those that add no text yet (the first byte of a character, a special token the text skips)
        stay too, even where a gen cut at max_tokens counted them: without speculation the next gen
        starts from the text, which lacks them, and generates them again. Nothing is left where
        the first ``n`` characters hold a U+FFFD: without speculation the next gen reads the text
        tokenized again, where U+FFFD is its own bytes (EF BF BD), not the bytes that were no
        character which the call's tokens held, so it would not write what the call wrote after
        them (a U+FFFD the model wrote as such costs a call it need not)."""
        if "\ufffd" in self.text[:n]:
            return Speculation()
        if self.ends is None:
            return dataclasses.replace(self, text=self.text[n:])
        first = bisect.bisect_left(self.ends, n)  # (ends never decrease)
        if n > 0 and first < len(self.ends) and self.ends[first] == n:  # it wrote the n-th: used
            first += 1
        kept = range(first, len(self.ends))
        return dataclasses.replace(self, text=self.text[n:], ends=tuple(self.ends[i] - n for i in kept),
                                   logprobs={k: tuple(v[i] for i in kept) for k, v in self.logprobs.items()})

    def end_of_tokens(self, k: int) -> Optional[int]:
        """Characters in the first ``k`` tokens; None if fewer are left (or boundaries are unknown:
        then ``k`` characters stand in for ``k`` tokens, SGLang's rule)."""
        if k <= 0:
            return 0
        if self.ends is None:
            return k if len(self.text) >= k else None
        return self.ends[k - 1] if len(self.ends) >= k else None

    def tokens_in(self, n: int) -> Optional[int]:
        """How many tokens wrote the first ``n`` characters: up to the one that wrote the n-th (a
        token cut in two counts; those after it that add no text, such as the first byte of the
        next character, do not, as the engine stops at that token); None if boundaries are unknown."""
        if self.ends is None:
            return None
        if n <= 0:
            return 0
        return min(bisect.bisect_left(self.ends, n) + 1, len(self.ends))  # (ends never decrease)


def _token_texts(pieces: list[str]) -> list[str]:
    """The text each token adds, of the per-token texts ``pieces``. OpenAI (and ``lmnb serve``)
    write a token holding part of a character as ``bytes:`` then its bytes, those that are no whole
    character escaped (``bytes:\\xc3``): such a token adds the characters its bytes complete (none,
    for the first byte of one), as the engine's text holds a character back until it is whole."""
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    out = []
    for piece in pieces:
        if not piece.startswith("bytes:"):
            out.append(decoder.decode(b"", final=True) + piece)  # (bytes no token completed: U+FFFD)
            decoder.reset()
            continue
        raw, pos = bytearray(), len("bytes:")
        for m in _BYTE_ESCAPE.finditer(piece, pos):
            raw += piece[pos:m.start()].encode("utf-8", "surrogatepass") + bytes([int(m[1], 16)])
            pos = m.end()  # (a server's lone surrogate: no error here, and a text that does not add up)
        out.append(decoder.decode(bytes(raw + piece[pos:].encode("utf-8", "surrogatepass"))))
    return out


def _follows(meta: dict, stops: list[str]) -> Optional[str]:
    """``Speculation.follows`` of a call that stopped at ``stops`` (strings), by its ``meta``'s
    finish reason: an EOS or stop token (the engine's ``matched`` token id, or a bare "stop" where
    the call had no stop strings) ends the output; ``matched`` text is the stop string."""
    reason = finish_reason_dict(meta)
    if reason.get("type") != "stop":
        return None
    matched = reason.get("matched")
    if isinstance(matched, int) or (matched is None and not stops):
        return ""
    return matched if isinstance(matched, str) and matched in stops else None


def _stop_in(params: GenParams, left: Speculation, end: Optional[int]) -> Optional[tuple[int, str]]:
    """The gen's first stop in the leftover ``left`` as the engine meets it where the gen writes
    that text itself (``GenParams.first_stop_match``): the text cut at ``end`` (the end of its
    max_tokens tokens, where known), where max tokens cut its output (an end a match reading it
    takes for no end, as the engine does: ``Scheduler._stop_at_end``), else the text followed by
    what the call wrote after it (``Speculation.follows``: the output's end or the call's stop
    string); a match in the call's stop string alone is none (the call's finish tells it)."""
    if end is not None:
        return params.first_stop_match(left.text[:end])
    if left.follows is None:
        return params.first_stop_match(left.text)
    hit = params.first_stop_match(left.text + left.follows, at_end=not left.follows)
    return hit if hit is None or hit[0] < len(left.text) else None


def _spec_tokens_noted(e: Exception, spec_tokens: int, limit: Optional[int]) -> Exception:
    """``e``, a backend's refusal of a speculative call, with where its ``max_tokens`` came from
    where that was ``num_api_spec_tokens`` (more than the gen's own ``limit``) and the request did
    not fit (``DOES_NOT_FIT``): the refusal says "lower max_tokens" of a number the gen never
    wrote, and its fix is the function's ``num_api_spec_tokens``. Else ``e`` as it is."""
    from lmnb_engine.params import DOES_NOT_FIT  # torch-free

    if getattr(e, "reason", None) != DOES_NOT_FIT or spec_tokens <= (limit or 0):
        return e
    return reworded(e, f"{e} (API speculative execution asked for num_api_spec_tokens={spec_tokens} tokens, more "
                       f"than the gen's max_tokens={limit}: lower @function(num_api_spec_tokens=N))")


def spec_gen(ex: "StreamExecutor", params: GenParams, expr: Gen) -> tuple[str, dict]:
    """Completion-model API speculative execution (SGLang's ``_spec_gen``): one call generates
    ``max(max_new_tokens, num_api_spec_tokens)`` tokens without the gen's stops, and this gen
    takes the text up to its first stop (a string or a ``stop_regex`` match); the rest is kept for
    later fills and gens that match.

    The gen takes at most ``max_new_tokens`` tokens of the text (before a stop string, if one
    comes first), as it would without speculation; the call asks for per-token text to find them
    (SGLang counts characters instead, which is also the fallback where a backend gives no token
    texts, or its server refuses the logprobs field and the gen does not ask for them:
    ``_speculative_call``). A gen calls again when fewer tokens than that are left over and none of its stops,
    and a gen with ``stop_token_ids`` always does (its call stops at them; the leftover's text,
    generated without them, was not cut there).

    Returns the gen's text and its meta_info: its own share of the call, ``completion_tokens``
    (left out where token boundaries are unknown) and ``finish_reason`` (``length``, or ``stop``
    with the stop it matched), as the same gen without speculation reports them; the gen that
    made the call also has the call's ``prompt_tokens`` etc., and the call's own
    ``completion_tokens`` and ``finish_reason`` in ``speculative_call``.
    """
    stops = bool(params.stop_list or params.stop_regexes)
    limit = params.max_new_tokens  # resolved by the executor (the run's default, else 128)

    call: Optional[dict] = None
    left = ex.speculation
    if left.ignore_eos and not params.ignore_eos:  # this gen would stop at an EOS in that text
        serves = False
    elif params.stop_token_ids:  # the leftover was not generated to stop at them: its own call does
        serves = False
    elif params.logit_bias != left.logit_bias:  # drawn with another bias (or none): its own call
        serves = False
    elif stops:  # the leftover serves this gen if it holds one of its stops or max_tokens tokens (SGLang
        # serves a gen with stops from any leftover, cut at max_tokens characters or where the leftover ends)
        serves = _stop_in(params, left, None) is not None or (
            bool(left.text) and limit is not None and left.end_of_tokens(limit) is not None)
    else:
        serves = bool(left.text) and left.end_of_tokens(limit or 0) is not None
    if not serves:
        spec = dataclasses.replace(
            params, max_new_tokens=max(limit or 0, ex.num_api_spec_tokens), stop=list(ex.message_end_stops(params)),
            stop_regex=None,
        )
        if params.return_logprob or not _logprobs_refused(ex.backend):
            spec = dataclasses.replace(spec, return_logprob=True, return_text_in_logprobs=True)
        try:
            comps, spec = _speculative_call(ex, spec, asked=bool(params.return_logprob))
        except (ValueError, BackendError) as e:
            raise _spec_tokens_noted(e, ex.num_api_spec_tokens, limit) from None
        ex._check_finish([comps[0].meta_info])
        token_text = getattr(ex.backend, "token_text", None)  # (the in-process engine reads a token's bytes)
        left = dataclasses.replace(Speculation.from_completion(comps[0].text, comps[0].meta_info, token_text),
                                   ignore_eos=bool(params.ignore_eos), follows=_follows(comps[0].meta_info, spec.stop),
                                   logit_bias=params.logit_bias)
        call = comps[0].meta_info
    end = left.end_of_tokens(limit) if limit is not None else None
    hit = _stop_in(params, left, end) if stops else None  # (one that ends by end, where known)
    # max_tokens ends it before a stop is whole (the engine matches a stop once its last character is written)
    if end is not None and hit is None:
        pos, used, finish = end, end, {"type": "length"}
        if getattr(ex.backend, "length_in_finish_reason", True):  # (in the backend's own form)
            finish["length"] = limit
    elif hit is not None:  # (the tokens that wrote the stop count, as they do without speculation)
        pos, used, finish = hit[0], hit[0] + len(hit[1]), {"type": "stop", "matched": hit[1]}
        # (one met only as the output ends, a$, too: through the token that ends it, not the EOS after)
    else:  # the call ended first: this gen takes all of it
        pos, used, finish = len(left.text), len(left.text), None
    ex.speculation = left.drop(pos)
    meta = dict(call or {}, speculative=True)
    if call is not None:  # (usage counts the call's tokens, not the share of the gen that made it)
        meta["speculative_call"] = {k: call[k] for k in ("completion_tokens", "finish_reason") if k in call}
    if finish is not None:  # this gen's share (SGLang gives the whole call's meta_info, or none)
        meta["finish_reason"] = finish
    if used is not None and finish is not None:
        meta.pop("completion_tokens", None)
        tokens = left.tokens_in(used)
        if tokens is not None and finish["type"] == "length":  # (the limit's tokens, those that add no text too)
            tokens = limit
        if tokens is not None:
            meta["completion_tokens"] = tokens
            for key in _LOGPROB_KEYS:
                meta.pop(key, None)  # (the call's, all of them)
                if key in left.logprobs:  # this gen's own tokens', a gen served from the leftover's too
                    meta[key] = list(left.logprobs[key][:tokens])
    if not params.return_logprob:  # asked for the cut only
        meta.pop("output_token_logprobs", None)
        meta.pop("output_top_logprobs", None)
    elif not params.return_text_in_logprobs:  # the call asked for token texts to cut by; this gen did not
        for key in _LOGPROB_KEYS:
            if key in meta:
                meta[key] = _textless_entries(key, meta[key])
    return left.text[:pos], meta


def _textless_entries(key: str, entries: list) -> list:
    """The logprobs ``entries`` of the meta_info key ``key`` as a call without
    ``return_text_in_logprobs`` writes them (``_textless``): for ``output_token_logprobs`` an entry
    a token, for ``output_top_logprobs`` a list of entries a token (or None)."""
    if key == "output_top_logprobs":
        return [None if top is None else [_textless(e) for e in top] for top in entries]
    return [_textless(e) for e in entries]


def _textless(entry: list) -> list:
    """A logprob entry ``[logprob, token_id, text]`` as a call without ``return_text_in_logprobs``
    writes it: text None, except where no token id names the token (the OpenAI API's entries,
    whose text it always writes)."""
    logprob, token_id, text = entry
    return [logprob, token_id, None if token_id is not None else text]


# GenParams fields that stay each gen's own in a chat model's speculative call: the call's max_tokens
# is num_api_spec_tokens and each gen's share is cut at its own, the reply is split at each gen's stop
# and stop_regex, and the logprob options change what is reported, not what is drawn (_role_share).
# The others are the call's, the first gen's.
_OWN_IN_CHAT_CALL = frozenset({"max_new_tokens", "stop", "stop_regex", "return_logprob", "logprob_start_len",
                               "top_logprobs_num", "return_text_in_logprobs"})
_SHOWN_CHARS = 60  # of a differing value in spec_role_check's message (a schema, a regex may be long)


def spec_role_check(terms: list[tuple], expr: Gen, params: GenParams, backend, written: str = "") -> None:
    """Refuse a chat model's deferred gen ``expr`` (with its resolved ``params``) whose sampling
    parameters differ from the first gen's of its assistant role (``terms``: the role's fills and
    gens so far, ``StreamExecutor._spec_terms``), before the role's one call is made.

    That call (``spec_role_end``) writes the whole assistant message with the first gen's
    parameters, so a later gen's own ``temperature``, ``logit_bias``, ``seed`` etc. would be
    silently ignored; a call of its own is no way out under speculation, which makes one call per
    role: a chat API cannot continue a half-written assistant message, and where ``backend`` can
    (``continue_final_message``) the error says to run without speculation (``_continuing``).
    SGLang's OpenAI backend refuses the same (an assertion in ``_prepare_spec_execution``; it
    compares the OpenAI arguments, lmnb every option that changes what is drawn). Not compared
    (``_OWN_IN_CHAT_CALL``): ``stop`` and ``stop_regex``, each gen's own (the reply is split at
    them), ``max_tokens`` (the call's is ``num_api_spec_tokens``; each share is cut at its gen's
    own) and the logprob options (each gen gets its own tokens' logprobs: ``_role_share``). Values
    are compared as drawn with (``_drawn_with``: ``stop_token_ids=[]`` is none).

    A gen after text the role already holds (``written``: a pick's choice, which is scored and written
    at once) is refused first where ``backend`` cannot continue it (``spec_role_written_check``), and
    a constrained gen beside text or another gen next (``spec_role_constraint_check``), whose fixes
    the differing options' would not be.

    Raises:
        ValueError: naming both gens, the differing options with both values, and the fix.
    """
    gen_k = sum(t[0] == "gen" for t in terms)  # (expr is the role's gen number gen_k + 1)
    spec_role_written_check(written, expr, gen_k + 1, backend)
    spec_role_constraint_check([*terms, ("gen", expr, params, None)], backend)
    first = next((t for t in terms if t[0] == "gen"), None)
    if first is None:
        return
    _, first_expr, first_params, _ = first
    fields = [f.name for f in dataclasses.fields(GenParams) if f.name not in _OWN_IN_CHAT_CALL
              and _drawn_with(f.name, getattr(params, f.name)) != _drawn_with(f.name, getattr(first_params, f.name))]
    if not fields:
        return
    this, that = _gen_named(expr, gen_k + 1), _gen_named(first_expr, 1)
    names = " and ".join(dict.fromkeys(_option_name(f, expr) for f in fields))
    why, way_out = _continuing(backend, this)
    raise ValueError(
        f"{this} has {_options(fields, expr, params, expr)} where {that}, the first gen of its assistant role, has "
        f"{_options(fields, first_expr, first_params, expr)}: under API speculative execution (num_api_spec_tokens) "
        f"a chat model writes the whole assistant message in one call, with the first gen's sampling parameters, "
        f"{why}; give the role's gens the same {names}, or put {this} in an assistant role of its own{way_out}"
    )


def continues_messages(backend) -> bool:
    """Whether chat ``backend`` continues a half-written assistant message (the prompt's
    ``role_text``) as the reply's start: ``lmnb.OpenAI(..., continue_final_message=True)`` (which
    refuses the option where the API has no such field), or another backend that sets
    ``continue_final_message = True``."""
    return getattr(backend, "continue_final_message", False) is True


def spec_role_written_check(written: str, expr: Gen, k: int, backend) -> None:
    """Refuse a chat model's speculated gen ``expr`` (its role's gen number ``k``) that follows text
    its assistant role already holds, ``written``: a pick (``select``, ``gen(choices=...)``), which is
    scored and written at once, before the role's held fills and gens. The role's one call
    (``spec_role_end``) then goes out with that text as a half-written assistant message
    (``Prompt.role_text``), which a chat API cannot continue: OpenAI's answers a new message, as if
    nothing were written. Where ``backend`` continues one (``continues_messages``) the call is sent
    so, and its reply is the continuation the role's gens are split from.

    Raises:
        ValueError: naming the gen, the text it follows and the fix.
    """
    if not written.strip() or continues_messages(backend):
        return
    this = _gen_named(expr, k)
    raise ValueError(
        f"{this} follows {written[:_SHOWN_CHARS]!r}, which a pick (select or gen(choices=...)) wrote in its "
        "assistant role: under API speculative execution (num_api_spec_tokens) a chat model writes the role's gens "
        f"in one call at the role's end, which would have to continue the half-written assistant message, and this "
        f"chat backend cannot continue one; put the pick in an assistant role of its own and {this} in the next, or "
        "use a backend that continues a half-written assistant message (continue_final_message=True)"
    )


def spec_role_constraint_check(terms: list[tuple], backend) -> None:
    """Refuse a chat model's speculated assistant role (``terms``: its fills and gens so far) where a
    gen with a ``regex``, ``json_schema`` or ``dtype`` (a regex by now) shares the role with text
    or another gen. The role's one call sends the first gen's options, so the constraint held the
    whole reply to one gen's pattern: the role's text and other gens could not be written ("42"
    for ``{a:int} and {b:int}``), and the reply never matched the role's pattern. A fill of
    whitespace alone counts as text: the reply is split at it verbatim (``_split``), so a JSON
    gen followed by " " took '{"name":' of '{"name": "Ann"}', and one the constraint cannot write
    failed the pattern. A gen alone
    in its role is the whole reply: its constraint is the call's, as without speculation. Called
    as each gen is deferred (``spec_role_check``) and at the role's end, before its call (text
    after the gen). Running without speculation is offered as ``backend`` can run the role so
    (``_way_off_speculation``).

    Raises:
        ValueError: naming the gen, its constraint and the fixes.
    """
    gens = [t for t in terms if t[0] == "gen"]
    k, term = next(((k, t) for k, t in enumerate(gens, 1)
                    if t[2].regex is not None or t[2].json_schema is not None), (0, None))
    if term is None:
        return
    others = [t for t in terms if t is not term and (t[0] == "gen" or t[1])]
    if not others:
        return
    _, expr, params, _ = term
    field = "regex" if params.regex is not None else "json_schema"
    this, name = _gen_named(expr, k), _option_name(field, expr)
    n_gens = sum(t[0] == "gen" for t in others)
    besides = ["text"] if len(others) > n_gens else []
    if n_gens:
        besides.append("another gen" if n_gens == 1 else f"{n_gens} other gens")
    besides = " and ".join(besides)
    raise ValueError(
        f"{this} has {_options([field], expr, params, expr)} in an assistant role that also holds {besides}: under "
        "API speculative execution (num_api_spec_tokens) a chat model writes the whole assistant message in one "
        f"call, with the first gen's options, so the {name} constrains the whole assistant message, the role's "
        "other text and gens too; put the gen alone in an assistant role of its own"
        f"{_way_off_speculation(backend, terms, _RUN_WITHOUT)}"
    )


# the fix of running without speculation where nothing refuses it in turn: the constrained gen's
# refusal's, and the refusal of a reply that did not follow the role's pattern
_RUN_WITHOUT = ", or run without API speculative execution (@function without num_api_spec_tokens)"
_TURN_OFF = "; or turn API speculative execution off (@function without num_api_spec_tokens)"


def _way_off_speculation(backend, terms: list[tuple], otherwise: str, server: str = "such a server",
                         sep: str = ",") -> str:
    """A refusal's fix of running a chat role (``terms``) without speculation, as ``backend`` can:
    without it an ``lmnb.OpenAI`` chat model writes a gen only at the start of the assistant message
    (its ``_prompt_kwargs``), unless it continues the reply (``continue_final_message``, a server
    other than OpenAI's own: ``_continuing``, whose ``server`` words are passed on; none on
    OpenAI's own API); so where a gen of the role comes after text or another gen, "run without
    speculation" alone (``otherwise``, the fix elsewhere) would be refused in turn, with the fix of
    speculating. ``sep``: the mark the way out begins with (after the refusal's other fix)."""
    from lmnb.backend.openai import OpenAI  # (here: import lmnb loads that module only where a program uses it)

    if isinstance(backend, OpenAI) and _gen_after_writing(terms):
        return _continuing(backend, "", server)[1].replace(",", sep, 1)  # (its way out only: the gen is in its reason)
    return otherwise


def _gen_after_writing(terms: list[tuple]) -> bool:
    """Whether a gen of the chat role ``terms`` comes after text or another gen of it: where,
    without speculation, an ``lmnb.OpenAI`` chat model that does not continue the reply refuses it."""
    written = False  # (the role holds text or a gen before this term)
    for term in terms:
        if term[0] == "gen" and written:
            return True
        written = written or term[0] == "gen" or bool(term[1].strip())
    return False


def _continuing(backend, this: str, server: str = "such a server") -> tuple[str, str]:
    """Why a chat model's speculated gen ``this`` cannot be drawn with its own options, and the way
    out where ``backend`` continues a half-written assistant message without speculation:
    ``lmnb.OpenAI(..., continue_final_message=True)`` does (a call per gen), and any other server
    than OpenAI's own may take that field (vLLM, SGLang, lmnb serve); speculation makes one call
    per role, so it never does. The fix names the Python API's option and ``%lm connect``'s, as
    ``OpenAI``'s own refusal of such a gen does, and the servers that take it as ``server`` (a
    refusal that gives no reason names them there)."""
    from lmnb.backend.openai import OpenAI  # (here: import lmnb loads that module only where a program uses it)

    if not isinstance(backend, OpenAI) or backend.is_official or not backend.is_chat_model:
        return f"and a chat API cannot continue a half-written assistant message to draw {this} with its own", ""
    why = f"and speculation makes no call of its own to continue the half-written assistant message for {this} "
    without = ("run without API speculative execution (@function without num_api_spec_tokens){}: each gen then "
               "continues the reply in a call of its own")
    if backend.continue_final_message:
        return why + "(this backend can continue it: continue_final_message=True)", ", or " + without.format("")
    return (why + "(a vLLM, SGLang or lmnb serve server can continue it, with continue_final_message)",
            f", or, on {server}, " + without.format(
                " and with OpenAI(..., continue_final_message=True) (in a notebook %lm connect URL --openai MODEL "
                "--continue-final-message)"))


def _drawn_with(field: str, value):
    """``value`` of GenParams ``field`` as what it changes in the draw, for ``spec_role_check``: an
    empty ``stop_token_ids`` and ``min_tokens=0`` are none (they were refused beside a gen without
    them; an empty ``logit_bias`` is None already, ``GenParams``), and stop token ids are a set
    (their order changes nothing). (A ``regex`` or ``json_schema`` never gets here:
    ``spec_role_constraint_check`` refuses it beside another gen.)"""
    if field == "stop_token_ids":
        return frozenset(value) if value else None
    if field == "min_new_tokens":
        return value or None
    return value


def _gen_named(expr: Gen, k: int) -> str:
    return f"gen {expr.name!r}" if expr.name is not None else f"the role's unnamed gen #{k}"


def _option_name(field: str, expr: Gen) -> str:
    """gen()'s name of ``field``: ``dtype`` where the gen's regex came from its dtype."""
    return "dtype" if field == "regex" and expr.params.dtype is not None else GEN_NAMES.get(field, field)


def _options(fields: list[str], expr: Gen, params: GenParams, refused: Gen) -> str:
    """``temperature=0.9, seed=3`` of ``params``' ``fields`` (gen ``expr``'s); one not set is
    ``no seed``, named as the ``refused`` gen's message names it (``no dtype``, not ``no regex``)."""
    out = []
    for f in fields:
        name = _option_name(f, expr)
        value = expr.params.dtype if name == "dtype" else getattr(params, f)
        if value is None:
            out.append(f"no {_option_name(f, refused)}")
            continue
        shown = getattr(value, "__name__", None) if name == "dtype" else None
        shown = shown or shown_value(value)
        out.append(f"{name}={shown if len(shown) <= _SHOWN_CHARS else shown[:_SHOWN_CHARS - 3] + '...'}")
    return ", ".join(out)


def spec_role_end(ex: "StreamExecutor") -> None:
    """Chat-model API speculative execution: the assistant role's gens were deferred; one chat
    call (``_role_call_params``: ``max_tokens=num_api_spec_tokens``, the first gen's other sampling
    parameters, which ``spec_role_check`` made sure are every gen's) answers them all, and its reply
    is matched against the role's pattern of fills and gens (up to ``SPEC_MAX_TRIES`` calls). Each
    gen then takes its share of the reply as the completion-model path does (``_role_share``): cut
    at its own ``max_tokens``, with its own ``completion_tokens``, ``finish_reason`` and logprobs;
    the first gen's meta_info also has the call's, its ``completion_tokens`` and ``finish_reason``
    in ``speculative_call``.

    Raises:
        ValueError: no reply followed the pattern, naming where the last one left it and the fix
            (``_split``); a gen asks for ``return_logprob`` where the reply's tokens are not known
            (``_role_share``).
    """
    terms, ex._spec_terms = ex._spec_terms, []
    spec_role_constraint_check(terms, ex.backend)  # (text after a constrained gen: the gen's deferral did not see it)
    gens = [t for t in terms if t[0] == "gen"]
    shares, meta, reply = [], {}, ""
    if gens:
        params = _role_call_params([t[2] for t in gens], ex.num_api_spec_tokens, list(ex.message_end_stops(gens[0][2])),
                                   counting=not _logprobs_refused(ex.backend))
        for _ in range(SPEC_MAX_TRIES):
            comps, params = _speculative_call(ex, params, asked=any(t[2].return_logprob for t in gens))
            reply, meta = comps[0].text, comps[0].meta_info
            ex._check_finish([meta])
            cut = finish_reason_dict(meta).get("type") == "length"
            tokens = Speculation.from_completion(reply, meta, getattr(ex.backend, "token_text", None))
            shares, why = _split(terms, reply, _follows(meta, params.stop), ex.num_api_spec_tokens if cut else None,
                                 tokens, len(meta.get("output_token_logprobs") or ()))
            if shares is not None:
                break
            # (its reply is dropped, but the call was made: views and batch records count it, as a refused gen's)
            ex._emit("var", meta_info=meta)
        if shares is None:
            raise ValueError(
                f"API speculative execution: after {SPEC_MAX_TRIES} calls the reply {reply[:200]!r} "
                f"does not follow the assistant role's pattern of text and gens: {why}"
                f"{_way_off_speculation(ex.backend, terms, _TURN_OFF, 'a vLLM, SGLang or lmnb serve server', ';')}"
            )
    ends = tokens.ends if gens else None
    outputs, start, k = [], 0, 0
    try:
        for term in terms:
            if term[0] == "text":
                start += len(term[1])
                continue
            value, how = shares[k]
            outputs.append(_role_share(_gen_named(term[1], k + 1), term[2], value, how, start, reply, ends, meta,
                                       first=k == 0, length_form=getattr(ex.backend, "length_in_finish_reason", True)))
            start, k = start + len(value), k + 1
    except ValueError:
        ex._emit("var", meta_info=meta)  # (the call was made: views and batch records count it)
        raise
    out = iter(outputs)
    unreported = [meta] if gens else []  # the call, until the first gen's variable reports it
    for term in terms:
        if term[0] == "text":
            ex._append_made(term[1], "fill", None, unreported)
        else:
            _, expr, _, parse = term
            text, own = next(out)
            ex._append_made(text, "gen", expr.name, unreported)
            ex._note_sampled_end(text, own)
            # (the first gen's refused value still reports the call, as a refused gen's own requests are)
            value = ex._parsed_all(expr, parse, [(text, own)])[0] if unreported else ex._parsed(expr, text, parse, own)
            ex._finish_var(expr.name, value, own, text=text)
            unreported = []


_LOGPROB_KEYS = ("output_token_logprobs", "output_top_logprobs")


def _role_call_params(gens: list[GenParams], spec_tokens: int, stops: list[str], counting: bool = True) -> GenParams:
    """The parameters of a chat role's one speculative call, of its gens' resolved ``gens``: the
    first gen's, with ``max_tokens=spec_tokens`` and the chat template's end-of-message ``stops``
    (each gen's own stops split the reply). Where a gen asks for logprobs, or (``counting``: the
    backend's model was not seen refusing them, ``_speculative_call``) its ``max_tokens`` is under
    ``spec_tokens`` (so its share may hold more tokens than it may write), the call asks for
    the logprobs with their token texts, as ``spec_gen``'s call does, to find each gen's tokens in
    the reply, with the most top logprobs any gen asks for (each gets its own number)."""
    asking = [p for p in gens if p.return_logprob]
    params = dataclasses.replace(gens[0], max_new_tokens=spec_tokens, stop=stops, stop_regex=None)
    if asking or counting and any(p.max_new_tokens is not None and p.max_new_tokens < spec_tokens for p in gens):
        top = max((p.top_logprobs_num or 0 for p in asking), default=0)
        params = dataclasses.replace(params, return_logprob=True, return_text_in_logprobs=True,
                                     top_logprobs_num=top or None)
    return params


# The backends whose server refused a speculative call for its logprobs, each with the model names it
# refused them for (_speculative_call): their later calls do not ask. Weak: a backend dropped is forgotten.
_REFUSING_LOGPROBS: "weakref.WeakKeyDictionary[object, set]" = weakref.WeakKeyDictionary()
_REFUSING_LOCK = threading.Lock()  # (run_batch's threads share a backend)
_LOGPROBS_WORD = re.compile(r"\blogprobs\b", re.IGNORECASE)  # (not top_logprobs: asked for only by a gen)


def refuses_logprobs(e: BaseException) -> bool:
    """Whether ``e`` is a server's refusal of a request's ``logprobs`` field: a ``BackendError`` of
    HTTP 400 (422: a validation error in FastAPI's form) whose error names the field, as its
    ``param`` (OpenAI's o-series models: "Unsupported parameter: 'logprobs' is not supported with
    this model.", param "logprobs") or in its message (hosts that leave ``param`` out): the
    server's words after "HTTP 400: ", not the route before them (a host or model named so)."""
    if not isinstance(e, BackendError) or e.status not in (400, 422):
        return False
    said = str(e)
    _, status, words = said.partition(f"HTTP {e.status}: ")
    return e.param == "logprobs" or bool(_LOGPROBS_WORD.search(words if status else said))


def _logprobs_refused(backend) -> bool:
    """Whether ``backend``'s server refused logprobs for its model before (``_speculative_call``)."""
    try:
        with _REFUSING_LOCK:
            return getattr(backend, "model_name", None) in _REFUSING_LOGPROBS.get(backend, ())
    except TypeError:  # (a backend no weak reference can name is never remembered)
        return False


def _speculative_call(ex: "StreamExecutor", params: GenParams, asked: bool) -> tuple[list, GenParams]:
    """The completions of a speculative call of ``params`` (``spec_gen``'s, or a chat role's), and
    the parameters of the call that gave them. Where the call asked for logprobs only to count
    each gen's tokens by (no gen asks for them: ``asked`` False) and the server refuses the field
    (``refuses_logprobs``), the call is made once more without them, and the backend's model is
    remembered as refusing them, so its later calls do not ask (``spec_gen``,
    ``_role_call_params``); each share is then cut at ``max_tokens`` characters (the rule where the
    call's tokens are not known: ``Speculation.end_of_tokens``, ``_role_share``).

    Raises:
        BackendError: the server refused the call otherwise, or refused logprobs a gen asks for
            (saying to drop them from the gen)."""
    try:
        return ex._call(ex.backend.generate, ex._prompt(), params), params
    except BackendError as e:
        if not params.return_logprob or not refuses_logprobs(e):
            raise
        if asked:
            raise BackendError(f"{e}; this server gives no logprobs for model "
                               f"{getattr(ex.backend, 'model_name', None)!r}: drop return_logprob (and "
                               "top_logprobs_num) from the gen", e.reason, e.param, e.status) from None
    try:
        with _REFUSING_LOCK:
            _REFUSING_LOGPROBS.setdefault(ex.backend, set()).add(getattr(ex.backend, "model_name", None))
    except TypeError:  # (a backend no weak reference can name: each call asks, and is refused, again)
        pass
    params = dataclasses.replace(params, return_logprob=None, return_text_in_logprobs=None, top_logprobs_num=None)
    return ex._call(ex.backend.generate, ex._prompt(), params), params


def _role_share(named: str, params: GenParams, value: str, how: tuple, start: int, reply: str,
                ends: Optional[tuple[int, ...]], call: dict, first: bool, length_form: bool) -> tuple[str, dict]:
    """A speculated chat gen's (``named``) text and meta_info: its share ``value`` of the role's ``reply``,
    which begins at character ``start`` and ended as ``how`` says (``_split``: at the gen's stop,
    at the next fill, or with the reply), as ``spec_gen`` gives a completion model's gen its share.

    Its tokens are those of the call's (``call``, its meta_info) whose text ends in the share, or
    in the stop it ended at (``ends``: ``Speculation.ends`` of the reply; a token that writes the
    fill's last characters and the share's first counts, as ``Speculation.drop`` keeps it); one that
    ends with the reply also has the tokens after its text (an EOS, the call's stop string). More
    than ``params.max_new_tokens`` of them: the gen takes the first that many, ``finish_reason``
    ``length``, as without speculation. Where ``ends`` is None (the reply came without token texts
    that add up to it) the tokens are not known: the share is cut at ``max_tokens`` characters (the
    completion path's rule, SGLang's) unless the whole call wrote no more than ``max_tokens``
    tokens, and ``completion_tokens`` is left out but where the share is the whole output.

    Raises:
        ValueError: the gen asks for ``return_logprob`` where its tokens are not known and its share
            is not the call's whole output (whose logprobs are the call's): which of the reply's
            logprobs are its own cannot be told."""
    limit = params.max_new_tokens
    lists = {key: call[key] for key in _LOGPROB_KEYS if isinstance(call.get(key), list)}
    whole = start == 0 and how[0] == "rest"  # (its share is the call's whole output)
    cut, span = None, None
    if ends is not None:
        lo = bisect.bisect_left(ends, start)  # (ends never decrease)
        if start > 0 and lo < len(ends) and ends[lo] == start:  # that token wrote the fill's last character
            lo += 1
        used = start + len(value) + (len(how[1]) if how[0] == "stop" else 0)  # (the stop's tokens count)
        if how[0] == "rest":
            hi = max(len(lists.get("output_token_logprobs", ())), len(ends))
        else:
            hi = max(lo, min(bisect.bisect_left(ends, used) + 1, len(ends))) if used > start else lo
        if limit is not None and hi - lo > limit:
            hi = lo + limit
            last = ends[hi - 1] if 0 < limit and hi - 1 < len(ends) else (len(reply) if limit else start)
            cut = min(max(last - start, 0), len(value))
        span = (lo, hi)
    elif limit is not None and len(value) > limit:
        written = call.get("completion_tokens")
        if not (isinstance(written, int) and written <= limit):
            cut = limit
    if cut is not None or how[0] == "length":
        finish = {"type": "length", **({"length": limit} if length_form else {})}
    elif how[0] == "stop":
        finish = {"type": "stop", "matched": how[1]}
    elif how[0] == "rest":  # (its output ended where the call's did)
        finish = call.get("finish_reason")
    else:  # (it met the next fill, where it would not have stopped itself: no finish reason is known)
        finish = None
    meta: dict = {"speculative": True}
    if first:  # (usage counts the call's tokens, not the first gen's share: as for completion models)
        meta = {k: v for k, v in call.items() if k not in ("completion_tokens", "finish_reason", *_LOGPROB_KEYS)}
        meta["speculative"] = True
        meta["speculative_call"] = {k: call[k] for k in ("completion_tokens", "finish_reason") if k in call}
    if finish is not None:
        meta["finish_reason"] = finish
    if span is not None:
        meta["completion_tokens"] = span[1] - span[0]
    elif whole and cut is None and "completion_tokens" in call:
        meta["completion_tokens"] = call["completion_tokens"]
    if params.return_logprob:
        if span is None and not (whole and cut is None):
            raise ValueError(
                f"{named} asks for return_logprob, but the reply of its assistant role's one call "
                "(API speculative execution, num_api_spec_tokens) came without token texts that add up to it, so "
                "which of its logprobs are the gen's is not known; drop the gen's return_logprob, or run it without "
                "API speculative execution (@function without num_api_spec_tokens), at the start of an assistant "
                "message or where the backend continues one (continue_final_message)")
        lo, hi = span if span is not None else (0, None)
        for key, entries in lists.items():
            if key == "output_top_logprobs" and not params.top_logprobs_num:
                continue
            own = entries[lo:hi]
            if key == "output_top_logprobs":  # (the call asked for the most any gen asks for)
                own = [None if top is None else top[:params.top_logprobs_num] for top in own]
            if not params.return_text_in_logprobs:  # the call asked for token texts to count by; this gen did not
                own = _textless_entries(key, own)
            meta[key] = own
    return (value if cut is None else value[:cut]), meta


def _gen_next(terms: list[tuple], k: int) -> bool:
    """Whether the role's term after term ``k`` (an empty fill aside) is a gen."""
    return next((t[0] == "gen" for t in terms[k + 1:] if t[0] == "gen" or t[1]), False)


def _max_tokens_end(tokens: Optional[Speculation], written: int, start: int, params: GenParams) -> Optional[int]:
    """Where, in the reply of ``tokens`` from character ``start`` on, a gen (``params``) that starts
    there ends at its ``max_tokens`` tokens: their characters, where the reply's token boundaries
    are known and the call wrote more after those tokens (text, or of its ``written`` tokens one
    the text skips: an EOS the gen never sampled; else None: the gen could take the rest). A token
    that writes the character before ``start`` and the one at it is the gen's first, as
    ``_role_share`` counts it (``Speculation.drop``)."""
    if tokens is None or tokens.ends is None or params.max_new_tokens is None:
        return None
    left = tokens.drop(start)
    end = left.end_of_tokens(params.max_new_tokens)
    if end is None or left.ends is None:
        return None
    used = len(tokens.ends) - len(left.ends) + params.max_new_tokens  # (the call's tokens through the gen's)
    return end if end < len(left.text) or written > used else None


def spec_match(terms: list[tuple], reply: str, follows: Optional[str] = None) -> Optional[list[str]]:
    """Split a speculative chat reply along an assistant role's fills and gens.

    Fills must appear verbatim in order (SGLang's ``spec_pattern_match``); a gen takes the text up
    to its first stop (a string or a ``stop_regex`` match, as the engine meets it: ``_stop_in``)
    — or, without one, up to the next fill — and the last gen may take the rest. ``follows``: what
    the call wrote after ``reply`` (``Speculation.follows``: "" where the reply ended, an EOS or
    stop token, so ``\bEND\b`` in a reply ending "x END" is a stop as it is where the gen's own
    output ends there). Returns the gen values, or None when the reply does not follow the pattern
    (``_split`` says why).
    """
    shares = _split(terms, reply, follows)[0]
    return None if shares is None else [value for value, _ in shares]


def _split(terms: list[tuple], reply: str, follows: Optional[str],
           cut_at: Optional[int] = None, tokens: Optional[Speculation] = None,
           written: int = 0) -> tuple[Optional[list[str]], str]:
    """``spec_match``'s gen values, each with how it ended (``("stop", the stop it matched)``,
    ``("fill", None)``: at the next fill, ``("rest", None)``: with the reply, ``("length", None)``:
    at its ``max_tokens``), and ""; or None and
    why the reply does not follow the pattern, with the fix where the program's pattern is the
    cause (``spec_role_end``'s error). ``cut_at``:
    the call's ``max_tokens`` where the reply was cut there, said where a gen met neither its stop
    nor the next fill (the cut may be why; not where the program's pattern is); None: the reply
    ended by itself, so neither more tokens nor a stop (which the fill must follow) mends that. ``tokens``: the
    reply with its token boundaries, where known (``Speculation.from_completion``), and ``written``
    the call's tokens (its logprob entries: an EOS after the text too): a gen right before another
    gen ends at its own ``max_tokens`` tokens where they end before its stop is whole, the next
    fill and the call's output, as without speculation it stops there and the next gen goes on
    (SGLang's pattern needs a stop there)."""
    values, rest, stopped = [], reply, None  # stopped: the last gen's name and the stop it ended at
    for k, term in enumerate(terms):
        if term[0] == "text":
            if rest.startswith(term[1]):
                rest, stopped = rest[len(term[1]):], None if term[1] else stopped
                continue
            if stopped is not None:  # (SGLang's rule: the text from a gen's stop on is the next fill)
                return None, (f"gen {stopped[0]!r} stops at {stopped[1]!r}, where the reply goes on {rest[:40]!r}, "
                              f"not with the next fill ({term[1]!r}): make each gen's stop the start of the fill "
                              f"after it, as in gen(stop=\"\\n\") + \"\\nAge: \"")
            return None, (f"the reply's text {rest[:40]!r} does not begin with the role's fill {term[1]!r}, which "
                          "the reply is split by: ask the model for the role's text in the prompt")
        name, params = term[1].name, term[2]
        stop = _stop_in(params, Speculation(rest, follows=follows), None)
        following = next((t[1] for t in terms[k + 1:] if t[0] == "text" and t[1]), None)
        # (a gen right before another ends at its max_tokens where they end before its stop is whole or the
        # next fill: the text after them is the next gen's, not text the role's fill replaces)
        cut = _max_tokens_end(tokens, written, len(reply) - len(rest), params) if _gen_next(terms, k) else None
        if cut is not None and (stop is not None and cut >= stop[0] + len(stop[1])
                                or following is not None and following in rest and cut >= rest.find(following)):
            cut = None
        if cut is not None:
            pos, stopped, how = cut, None, ("length", None)
        elif stop is not None:
            pos, stopped, how = stop[0], (name, stop[1]), ("stop", stop[1])
        elif following is not None and following in rest:
            pos, stopped, how = rest.find(following), None, ("fill", None)
        elif following is None and all(t[0] == "text" for t in terms[k + 1:]):
            pos, stopped, how = len(rest), None, ("rest", None)
        elif following is None:
            after = next(t[1].name for t in terms[k + 1:] if t[0] == "gen")
            return None, (f"gen {name!r} met no stop in the reply's text {rest[:40]!r}, and no fill comes before "
                          f"gen {after!r} to end it: give gen {name!r} a stop")
        elif cut_at:
            return None, (f"gen {name!r} met neither its stop nor the next fill ({following!r}) in the reply's "
                          f"text {rest[:40]!r}: raise num_api_spec_tokens or add stop strings (the reply was cut at "
                          f"num_api_spec_tokens={cut_at} tokens: raise it)")
        else:  # (the reply ended by itself: more tokens or a stop, which the fill must follow, mend nothing)
            return None, (f"gen {name!r} met neither its stop nor the next fill ({following!r}) in the reply's "
                          f"text {rest[:40]!r}, which ended without the fill: ask the model for the role's text "
                          "in the prompt")
        values.append((rest[:pos], how))
        rest = rest[pos:]
    return values, ""
