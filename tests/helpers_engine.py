"""Reference values for engine tests, computed with HF transformers (never with lmnb_engine)."""

from __future__ import annotations

import codecs
import contextlib
import random

import torch


class HFReference:
    """Greedy continuations (``generate``) and per-token logprobs of a checkpoint, memoised."""

    def __init__(self, path) -> None:
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
        self.eos = self.model.generation_config.eos_token_id
        self._greedy: dict = {}

    @torch.no_grad()
    def greedy(self, ids: list[int], max_new_tokens: int) -> list[int]:
        """HF ``generate`` (do_sample=False): new ids, ending with EOS if it was produced."""
        key = (tuple(ids), max_new_tokens)
        if key not in self._greedy:
            out = self.model.generate(
                torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                max_new_tokens=max_new_tokens, do_sample=False,
            )
            self._greedy[key] = out[0, len(ids) :].tolist()
        return self._greedy[key]

    @torch.no_grad()
    def greedy_ignore_eos(self, ids: list[int], max_new_tokens: int) -> list[int]:
        """Argmax decoding with the HF model for exactly ``max_new_tokens`` steps (EOS ignored)."""
        key = (tuple(ids), max_new_tokens, "ignore_eos")
        if key not in self._greedy:
            seq = torch.tensor([ids])
            for _ in range(max_new_tokens):  # full recompute each step: no cache to get wrong
                nxt = self.model(seq, use_cache=False).logits[:, -1:].argmax(dim=-1)
                seq = torch.cat([seq, nxt], dim=1)
            self._greedy[key] = seq[0, len(ids) :].tolist()
        return self._greedy[key]

    @torch.no_grad()
    def token_logprobs(self, ids: list[int]) -> list[float]:
        """logprob of ids[j] given ids[:j] for j in [1, len), from one full forward."""
        logits = self.model(torch.tensor([ids])).logits[0].float()
        lps = torch.log_softmax(logits, dim=-1)
        return lps[torch.arange(len(ids) - 1), torch.tensor(ids[1:])].tolist()


def shared_prefix_prompts(tokenizer, n: int, seed: int = 0, prefix_words: int = 30) -> list[list[int]]:
    """``n`` prompts: two families of shared prefixes (plus sub-prefixes) with distinct tails."""
    rng = random.Random(seed)
    words = "the a red blue cat dog bird tree city house one two three what who where yes no".split()
    heads = [" ".join(rng.choice(words) for _ in range(prefix_words)) for _ in range(2)]
    prompts = []
    for i in range(n):
        head = heads[i % 2]
        if i % 3 == 0:  # a shorter shared part, so the tree branches at several depths
            head = " ".join(head.split()[: prefix_words // 2])
        tail = " ".join(rng.choice(words) for _ in range(rng.randint(2, 8)))
        prompts.append(tokenizer.encode(f"{head} {tail}", add_special_tokens=False))
    return prompts


def assert_idle_accounting(engine, pinned_tokens: int = 0) -> None:
    """Idle engine: free + evictable + protected == pool size, protected == pinned tokens, and no
    request registered unfinished (``abort`` would find one, and it would never end)."""
    assert [rid for rid, h in engine._handles.items() if not h.done] == []
    engine.check_invariants()
    s = engine.cache_stats()
    assert s["running_requests"] == 0 and s["waiting_requests"] == 0 and s["held_tokens"] == 0
    assert s["free_tokens"] + s["evictable_tokens"] + s["protected_tokens"] == s["pool_size"]
    assert s["protected_tokens"] == pinned_tokens


@contextlib.contextmanager
def nan_embedding(engine, token_id: int):
    """Within the block, ``token_id``'s embedding row of ``engine``'s model is NaN: every prompt
    holding that token gets non-finite values from the model itself."""
    emb = engine.runner.model.model.embed_tokens.weight
    saved = emb[token_id].clone()
    with torch.no_grad():
        emb[token_id] = float("nan")
    try:
        yield
    finally:
        with torch.no_grad():
            emb[token_id] = saved


def unused_token(engine, *id_lists) -> int:
    """The highest token id of ``engine``'s vocabulary that none of ``id_lists`` holds."""
    vocab = engine.runner.model.model.embed_tokens.weight.shape[0]
    return max(set(range(vocab)).difference(*id_lists))


def utf8_whole_characters(tokenizer, ids) -> str:
    """The text of ``ids`` (no special token) from their own bytes (byte-level BPE's byte-to-character table, read
    backwards), decoded as UTF-8 up to the incomplete character at its end, which is left out
    (bytes that never form a character read U+FFFD). Incomplete: some continuation bytes make it
    one character (Python's incremental decoder also holds ED A0..BF, a surrogate's start, which
    none does: those read U+FFFD, as in the tokenizer's decode)."""
    import itertools

    from transformers.convert_slow_tokenizer import bytes_to_unicode

    byte_of = {c: b for b, c in bytes_to_unicode().items()}
    raw = bytes(byte_of[c] for t in tokenizer.convert_ids_to_tokens(ids) for c in t)
    utf8 = codecs.getincrementaldecoder("utf-8")("replace")
    text, held = utf8.decode(raw, final=False), utf8.getstate()[0]

    def one_character(b: bytes) -> bool:
        try:
            return len(b.decode("utf-8")) == 1
        except UnicodeDecodeError:
            return False

    if any(one_character(held + bytes(more)) for n in (1, 2, 3)
           for more in itertools.product((0x80, 0x90, 0xA0, 0xBF), repeat=n)):
        return text
    return text + held.decode("utf-8", "replace")
