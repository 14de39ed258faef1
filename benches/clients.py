"""The systems a workload runs on, behind the ``workloads.Client`` calls.

- ``EngineClient``: lmnb's in-process ``Engine`` (radix cache on or off). Every request is
  submitted at once and runs under continuous batching; ``prefill`` sends the frontend hint
  (``max_new_tokens=0``, paper §3); ``select`` scores each choice's normalized prompt logprob.
  It logs every request (prompt and output), from which the workload's optimal hit rate is
  computed.
- ``HFClient``: Hugging Face transformers with no reuse, as ``shared/bench/hf_baseline.py``
  measures it: a thread gathers the requests that arrive together into left-padded batches
  (static batching: one ``generate`` per batch, full prompts every time). It has no regex
  constraints (fields are generated unconstrained, with the same token budgets).
"""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future
from typing import Any

GREEDY_KW = dict(temperature=0.0, ignore_eos=True)


class EngineClient:
    """``workloads.Client`` over an ``lmnb_engine.Engine``."""

    def __init__(self, engine: Any) -> None:
        from lmnb_engine import SamplingParams

        self.engine = engine
        self._params = SamplingParams
        self._lock = threading.Lock()
        self.requests: list[tuple[list[int], list[int]]] = []

    def take_requests(self) -> list[tuple[list[int], list[int]]]:
        """(prompt, output) of every request finished since the last call (and forget them)."""
        with self._lock:
            out, self.requests = self.requests, []
        return out

    def _wait(self, prompt: list[int], handle: Any) -> Any:
        result = handle.result()
        with self._lock:
            self.requests.append((prompt, list(result.token_ids)))
        return result

    def _submit(self, prompt: list[int], **kw) -> Any:
        return self.engine.submit(prompt, self._params(**kw))

    def gen(self, prompt: list[int], max_new_tokens: int, regex: str | None = None) -> list[int]:
        handle = self._submit(prompt, max_new_tokens=max_new_tokens, regex=regex, **GREEDY_KW)
        return self._wait(prompt, handle).token_ids

    def gen_many(self, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
        handles = [self._submit(p, max_new_tokens=max_new_tokens, **GREEDY_KW) for p in prompts]
        return [self._wait(p, h).token_ids for p, h in zip(prompts, handles)]

    def prefill(self, prompts: list[list[int]]) -> None:
        for p, h in [(p, self._submit(p, max_new_tokens=0)) for p in prompts]:
            self._wait(p, h)

    def select(self, prefix: list[int], choices: list[list[int]]) -> int:
        self.prefill([prefix])
        full = [prefix + c for c in choices]
        handles = [self._submit(p, max_new_tokens=0, logprob_start_len=len(prefix)) for p in full]
        scores = []
        for p, h in zip(full, handles):
            lps = [lp.logprob for lp in self._wait(p, h).prompt_logprobs if lp is not None]
            scores.append(sum(lps) / len(lps))
        return max(range(len(choices)), key=scores.__getitem__)


class HFClient:
    """``workloads.Client`` over a transformers causal LM, batching concurrent requests.

    Args:
        model: a ``*ForCausalLM`` in eval mode on its device.
        pad_id: token used for padding (masked out).
        max_batch: most requests per batched call.
        gather_s: how long the batcher waits after the first request for others to arrive.
    """

    def __init__(self, model: Any, pad_id: int = 0, max_batch: int = 64, gather_s: float = 0.002) -> None:
        self.model = model
        self.pad_id = pad_id
        self.max_batch = max_batch
        self.gather_s = gather_s
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name="hf-batcher", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._inbox.put(None)
        self._thread.join(60)

    # --- the Client calls -----------------------------------------------------------------------
    def _ask(self, kind: str, prompt: list[int], n: int) -> Future:
        fut: Future = Future()
        self._inbox.put((kind, prompt, n, fut))
        return fut

    def gen(self, prompt: list[int], max_new_tokens: int, regex: str | None = None) -> list[int]:
        return self._ask("gen", prompt, max_new_tokens).result()

    def gen_many(self, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
        return [f.result() for f in [self._ask("gen", p, max_new_tokens) for p in prompts]]

    def prefill(self, prompts: list[list[int]]) -> None:
        """No cache to fill: a no-op."""

    def select(self, prefix: list[int], choices: list[list[int]]) -> int:
        futs = [self._ask("score", prefix + c, len(c)) for c in choices]
        scores = [sum(lps) / len(lps) for lps in (f.result() for f in futs)]
        return max(range(len(choices)), key=scores.__getitem__)

    # --- the batcher ----------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            first = self._inbox.get()
            if first is None:
                return
            items = [first]
            deadline = time.perf_counter() + self.gather_s
            while len(items) < self.max_batch:
                try:
                    item = self._inbox.get(timeout=max(0.0, deadline - time.perf_counter()))
                except queue.Empty:
                    break
                if item is None:
                    self._inbox.put(None)
                    break
                items.append(item)
            groups: dict[tuple[str, int], list] = {}
            for it in items:  # one generate for all, padded to the longest budget (static batching);
                # 1-token requests take the cheaper forward-only path
                groups.setdefault((it[0], 1 if it[0] == "gen" and it[2] == 1 else 0), []).append(it)
            for (kind, n), group in groups.items():
                try:
                    results = self._score(group) if kind == "score" else self._generate(group)
                    for it, r in zip(group, results):
                        it[3].set_result(r)
                except Exception as exc:  # noqa: BLE001 - reported to each waiting program
                    for it in group:
                        if not it[3].done():
                            it[3].set_exception(exc)

    def _left_pad(self, prompts: list[list[int]]):
        import torch

        dev = next(self.model.parameters()).device
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, width - len(p):] = torch.tensor(p)
            mask[i, width - len(p):] = 1
        return ids.to(dev), mask.to(dev)

    def _generate(self, group: list) -> list[list[int]]:
        import torch

        n = max(it[2] for it in group)
        ids, mask = self._left_pad([it[1] for it in group])
        with torch.inference_mode():
            if n == 1:  # one token: a forward with the last logits only (hf_baseline.py's few-shot)
                pos = (mask.cumsum(-1) - 1).clamp_(min=0)
                logits = self.model(ids, attention_mask=mask, position_ids=pos, use_cache=False,
                                    logits_to_keep=1).logits
                return [[t] for t in logits[:, -1].argmax(-1).tolist()]
            out = self.model.generate(ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                      eos_token_id=None, pad_token_id=self.pad_id)
        return [row[: it[2]] for row, it in zip(out[:, ids.shape[1]:].tolist(), group)]

    def _score(self, group: list) -> list[list[float]]:
        """Logprobs of each sequence's last ``n`` tokens given what precedes them."""
        import torch

        ids, mask = self._left_pad([it[1] for it in group])
        keep = max(it[2] for it in group) + 1
        with torch.inference_mode():
            pos = (mask.cumsum(-1) - 1).clamp_(min=0)
            logits = self.model(ids, attention_mask=mask, position_ids=pos, use_cache=False,
                                logits_to_keep=keep).logits.float()
            lps = torch.log_softmax(logits[:, :-1], dim=-1)  # row j predicts token width - keep + 1 + j
            targets = ids[:, ids.shape[1] - keep + 1:]
            picked = lps.gather(-1, targets[..., None])[..., 0].tolist()
        return [row[len(row) - it[2]:] for row, it in zip(picked, group)]
