"""Jump-forward drafts: the forced string of the compressed FSM as tokens the model would choose.

The paper's jump-forward (§4; SGLang ``jump_forward.py`` and ``Req.jump_forward_and_retokenize``)
appends the forced string as tokens and retokenizes the recent output around it, replacing the
model's own tokens where the retokenization differs. That replacement is what changed greedy
outputs (sglang#2025, #2045) and led SGLang to remove the feature (PR #4032): the model is then
conditioned on tokens it did not choose, and everything after differs.

lmnb keeps the retokenization but never rewrites a token the model chose. The forced string is
turned into a *draft*:

1. Retokenize a window of the last ``JUMP_WINDOW`` output tokens plus the forced string. If the
   window's tokens come back unchanged, the rest is the canonical tokenization of the forced
   string in context (mlc-llm PR #2551, TensorRT-Edge-LLM ``JumpForwardPlanner``). If they change
   (the forced text would fuse with the model's last tokens), the forced string is tokenized on
   its own instead — the model's tokens stay.
2. Walk the draft through the grammar and stop at the first token it does not allow.
3. Hold back a trailing draft token whose bytes are a strict prefix of another token's, unless the
   grammar is complete after it: the model may well pick the longer token there (mlc-llm).

The engine appends the draft and runs one **extend** over the last sampled token plus the draft,
with logits at every position. Each draft token is kept only while it equals the token the
sampler picks at its position under the grammar's mask there (``accept_draft``); at the first
difference the sampler's token is taken and the rest of the draft is rolled back (its KV slots
freed). Greedy output is therefore token-for-token the output of plain masked decoding, and a
pass yields ``accepted + 1`` tokens instead of 1. Tokens whose mask allows only one choice are
always accepted, whatever the model.
"""

from __future__ import annotations

from lmnb_engine.constrained.grammar import CompiledGrammar

JUMP_WINDOW = 4  # output tokens retokenized with the forced string (enough to span a BPE word)


def _is_continuation(byte: int) -> bool:
    return 0x80 <= byte <= 0xBF


def _complete_utf8_len(data: bytes) -> int:
    """Length of the longest prefix of ``data`` that does not end inside a UTF-8 character."""
    end = len(data)
    back = 0
    while back < min(4, end) and _is_continuation(data[end - 1 - back]):
        back += 1
    if back == end:
        return end
    lead = data[end - 1 - back]
    need = 1 if lead < 0x80 else 2 if lead >> 5 == 0b110 else 3 if lead >> 4 == 0b1110 else 4 if lead >> 3 == 0b11110 else 1
    return end if back + 1 >= need else end - 1 - back


def _tokenize_alone(grammar: CompiledGrammar, forced: bytes) -> list[int]:
    """Tokens for ``forced`` with no context: leading UTF-8 continuation bytes (the rest of a
    character the model started) as one-byte tokens, then the tokenizer's encoding."""
    vocab = grammar.vocab
    draft: list[int] = []
    i = 0
    while i < len(forced) and _is_continuation(forced[i]):
        t = int(vocab.byte_token[forced[i]])
        if t < 0:
            return draft
        draft.append(t)
        i += 1
    rest = forced[i:]
    try:
        text = rest.decode("utf-8")
    except UnicodeDecodeError:
        return draft
    return draft + (vocab.encode(text) if text else [])


def _retokenize(grammar: CompiledGrammar, window: list[int], forced: bytes) -> list[int]:
    """Draft tokens spelling a prefix of ``forced`` after the output tokens ``window``."""
    vocab = grammar.vocab
    head = vocab.text_of(window)
    forced = forced[: max(0, _complete_utf8_len(head + forced) - len(head))]  # whole characters only
    if not forced:
        return []
    while window:
        head = vocab.text_of(window)
        try:
            text = (head + forced).decode("utf-8")
        except UnicodeDecodeError:  # the window starts inside a character: shorten it
            window = window[1:]
            continue
        ids = vocab.encode(text)
        if ids[: len(window)] == window:
            return ids[len(window) :]
        break
    return _tokenize_alone(grammar, forced)


def plan_draft(grammar: CompiledGrammar, state: int, recent_ids: list[int], max_tokens: int) -> list[int]:
    """Draft token ids for the forced string at ``state`` (empty if none or ``max_tokens <= 0``).

    Args:
        grammar: the compiled grammar; state: the matcher's current state (after the last token).
        recent_ids: the request's last output token ids (only the last ``JUMP_WINDOW`` are read).
        max_tokens: cap on the draft length (the request's remaining token budget).
    """
    forced, _ = grammar.forced_bytes(state)
    if not forced or max_tokens <= 0:
        return []
    window = [t for t in recent_ids[-JUMP_WINDOW:] if grammar.vocab.token_bytes[t] is not None]
    draft = _retokenize(grammar, window, forced)
    if not forced.startswith(grammar.vocab.text_of(draft)):
        return []  # the tokenizer normalised the text (e.g. a SentencePiece dummy prefix)
    kept, s = [], state
    for t in draft[:max_tokens]:
        nxt = grammar.next_state(s, t)
        if nxt is None:
            break
        kept.append(t)
        s = nxt
    if kept and grammar.vocab.is_prefix_token[kept[-1]] and not grammar.is_terminal(s):
        kept.pop()
    return kept
