"""Held-out eval of the demo model: multiple choice, few-shot exact match, chat EOS.

The tasks run against a two-method interface (``Backend``) so the same code measures the model
through Hugging Face ``transformers`` (``HFBackend``, the reference) and through lmnb's own runtime
(``EngineBackend``):

- multiple choice: each option is scored as the continuation ``" " + option`` of the prompt;
  the option with the highest mean token logprob wins (length-normalized, as SGLang's ``select``
  does with ``normalized_prompt_logprobs``). Chance is 25%.
- few-shot Q/A: greedy continuation of a three-shot ``Q: … A:`` prompt, cut at the first newline,
  must equal the answer exactly.
- chat: greedy assistant reply to a held-out conversation must end with EOS within
  ``CHAT_MAX_NEW_TOKENS``.

Items come from ``corpus.heldout_items(seed)``: questions never asked in training.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from lmnb_engine.demo import corpus

CHAT_MAX_NEW_TOKENS = 64
FEWSHOT_MAX_NEW_TOKENS = 24


@dataclass(frozen=True)
class Generation:
    """Greedy output: ``text`` (stop string and special tokens removed), ``token_ids``, and
    ``eos`` = True when generation ended with the model's EOS token."""

    text: str
    token_ids: list[int]
    eos: bool


class Backend(Protocol):
    """What the eval needs from a model runtime."""

    tokenizer: Any

    def score(self, prompt_ids: list[int], start: int) -> list[float]:
        """Natural-log probabilities of ``prompt_ids[start:]`` each given its prefix (``start >= 1``)."""

    def generate(self, prompt_ids: list[int], max_new_tokens: int, stop: str | None = None) -> Generation:
        """Greedy continuation of ``prompt_ids``, ending at EOS, ``stop`` or ``max_new_tokens``."""


class HFBackend:
    """``Backend`` over a ``transformers`` causal LM (fp32, CPU); the reference implementation."""

    def __init__(self, path: str, threads: int | None = None):
        import torch
        import transformers

        if threads:
            torch.set_num_threads(threads)
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(path)
        self.model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        self.eos_token_id = self.model.generation_config.eos_token_id

    def score(self, prompt_ids: list[int], start: int) -> list[float]:
        """See ``Backend.score``."""
        import torch

        if start < 1:
            raise ValueError(f"start={start}: the first token has no prefix to score it from; use start >= 1")
        with torch.no_grad():
            logits = self.model(torch.tensor([prompt_ids])).logits[0].float()
        logp = torch.log_softmax(logits, dim=-1)
        return [logp[i - 1, prompt_ids[i]].item() for i in range(start, len(prompt_ids))]

    def generate(self, prompt_ids: list[int], max_new_tokens: int, stop: str | None = None) -> Generation:
        """See ``Backend.generate``."""
        import torch

        kwargs = dict(stop_strings=[stop], tokenizer=self.tokenizer) if stop else {}
        with torch.no_grad():
            out = self.model.generate(
                torch.tensor([prompt_ids]), attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
                max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=self.eos_token_id,
                pad_token_id=self.tokenizer.pad_token_id, **kwargs)
        new = out[0, len(prompt_ids):].tolist()
        eos = bool(new) and new[-1] == self.eos_token_id
        text = self.tokenizer.decode(new, skip_special_tokens=True)
        if stop and stop in text:
            text = text[: text.index(stop)]
        return Generation(text, new, eos)


class EngineBackend:
    """``Backend`` over ``lmnb_engine.engine.Engine`` (greedy ``generate``; prompt ``score``)."""

    def __init__(self, engine: Any):
        self.engine = engine
        self.tokenizer = engine.tokenizer

    def score(self, prompt_ids: list[int], start: int) -> list[float]:
        """See ``Backend.score``."""
        return list(self.engine.score(prompt_ids, start))

    def generate(self, prompt_ids: list[int], max_new_tokens: int, stop: str | None = None) -> Generation:
        """See ``Backend.generate``."""
        from lmnb_engine.params import SamplingParams

        res = self.engine.generate(prompt_ids, SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens, stop=stop))
        fr = res.finish_reason
        eos = fr.type == "stop" and fr.matched in self.engine.eos_token_ids
        return Generation(res.text, list(res.token_ids), eos)


def encode_plain(tokenizer: Any, text: str) -> list[int]:
    """Ids of a plain-text prompt: BOS + text (the tokenizer's post-processor adds BOS)."""
    return tokenizer(text)["input_ids"]


def encode_chat(tokenizer: Any, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
    """Ids of a conversation rendered with the checkpoint's chat template (BOS from the template)."""
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def choice_logprob(backend: Backend, prompt: str, choice: str) -> float:
    """Mean token logprob of ``" " + choice`` after ``prompt`` (SGLang ``select``'s normalized score).

    Prompt and choice are tokenized together and the choice's tokens are those past the longest
    common prefix with the prompt's own ids, so a token that spans the boundary is still scored.
    """
    tok = backend.tokenizer
    p_ids = encode_plain(tok, prompt)
    full = encode_plain(tok, f"{prompt} {choice}")
    start = 0
    while start < min(len(p_ids), len(full)) and p_ids[start] == full[start]:
        start += 1
    lps = backend.score(full, start)
    return sum(lps) / len(lps)


def pick_choice(backend: Backend, item: corpus.MCItem) -> int:
    """Index of the option with the highest normalized logprob."""
    scores = [choice_logprob(backend, item.prompt, o) for o in item.options]
    return max(range(len(scores)), key=scores.__getitem__)


def fewshot_answer(backend: Backend, item: corpus.GenItem) -> str:
    """Greedy answer to a few-shot item: the continuation up to the first newline, stripped."""
    gen = backend.generate(encode_plain(backend.tokenizer, item.prompt), FEWSHOT_MAX_NEW_TOKENS, stop="\n")
    return gen.text.split("\n")[0].strip()


def chat_reply(backend: Backend, item: corpus.ChatItem) -> Generation:
    """Greedy assistant reply to a held-out conversation."""
    return backend.generate(encode_chat(backend.tokenizer, list(item.messages)), CHAT_MAX_NEW_TOKENS)


@dataclass
class EvalReport:
    """Accuracies in [0, 1]; ``by_kind`` splits MC and few-shot by task kind (fact/number/list)."""

    mc_accuracy: float
    fewshot_exact_match: float
    chat_eos_rate: float
    n_mc: int
    n_fewshot: int
    n_chat: int
    by_kind: dict[str, float] = field(default_factory=dict)
    examples: list[dict] = field(default_factory=list)

    def to_dict(self) -> dict:
        """The report as JSON-ready dicts and lists."""
        return asdict(self)


def _rate(hits: list[bool]) -> float:
    return sum(hits) / len(hits) if hits else float("nan")


def run_eval(backend: Backend, seed: int = 0, n_mc: int = 400, n_fewshot: int = 300,
             n_chat: int = 200, n_examples: int = 3) -> EvalReport:
    """Run all three tasks on the first ``n_*`` held-out items of ``seed``; returns an ``EvalReport``."""
    items = corpus.heldout_items(seed, n_mc=n_mc, n_fewshot=n_fewshot, n_chat=n_chat)
    kinds: dict[str, list[bool]] = defaultdict(list)
    examples: list[dict] = []
    mc_hits = []
    for it in items.mc:
        ok = pick_choice(backend, it) == it.answer
        mc_hits.append(ok)
        kinds[f"mc/{it.kind}"].append(ok)
    fs_hits = []
    for it in items.fewshot:
        got = fewshot_answer(backend, it)
        fs_hits.append(got == it.answer)
        kinds[f"fewshot/{it.kind}"].append(got == it.answer)
        if len(examples) < n_examples:
            examples.append({"task": "fewshot", "question": it.question, "answer": it.answer, "got": got})
    chat_hits = []
    for i, it in enumerate(items.chat):
        gen = chat_reply(backend, it)
        chat_hits.append(gen.eos)
        if i < n_examples:
            examples.append({"task": "chat", "user": it.question, "reply": gen.text, "eos": gen.eos})
    return EvalReport(
        mc_accuracy=_rate(mc_hits), fewshot_exact_match=_rate(fs_hits), chat_eos_rate=_rate(chat_hits),
        n_mc=len(mc_hits), n_fewshot=len(fs_hits), n_chat=len(chat_hits),
        by_kind={k: round(_rate(v), 4) for k, v in sorted(kinds.items())}, examples=examples,
    )
