"""Drive an lmnb_engine model by hand (KV pool, request rows, ForwardBatch) and compare with HF.

Used by the model parity and loader tests; the scheduler is not involved, so a failure here is a
model or attention-backend failure.
"""

from __future__ import annotations

import torch

from lmnb_engine.attention.torch_backend import TorchAttentionBackend
from lmnb_engine.forward_batch import ForwardBatch, ForwardMode
from lmnb_engine.kv_pool import ReqToTokenPool, TokenToKVPool


class ManualRunner:
    """Owns a KV pool and request table for one ``LoadedModel``; runs EXTEND/DECODE passes."""

    def __init__(self, lm, pool_size: int = 4096, max_reqs: int = 16) -> None:
        c = lm.config
        self.lm = lm
        self.kv = TokenToKVPool(pool_size, c.num_layers, c.num_kv_heads, c.head_dim, c.dtype, c.device)
        self.r2t = ReqToTokenPool(max_reqs, c.context_len, c.device)
        self.attn = TorchAttentionBackend()
        self.seq_len: dict[int, int] = {}

    def new_request(self) -> int:
        row = self.r2t.alloc()
        self.seq_len[row] = 0
        return row

    def run(self, mode: ForwardMode, reqs: list[tuple[int, list[int]]], all_logits: bool = False) -> torch.Tensor:
        """One pass: request ``row`` appends ``ids`` after what it already has in the pool.

        Returns float32 logits: of every new token (``all_logits``) or of each request's last one.
        """
        ids, rows, prefix, ext, locs = [], [], [], [], []
        for row, toks in reqs:
            p = self.seq_len[row]
            slots = self.kv.alloc(len(toks))
            self.r2t.req_to_token[row, p : p + len(toks)] = slots.to(torch.int32)
            ids += toks
            rows.append(row)
            prefix.append(p)
            ext.append(len(toks))
            locs.append(slots)
            self.seq_len[row] = p + len(toks)
        batch = ForwardBatch.build(
            mode, ids, torch.cat(locs), self.r2t.req_to_token, rows, prefix, ext,
            logits_indices=list(range(len(ids))) if all_logits else None, device=self.lm.config.device,
        )
        return self.lm.model(batch, self.attn, self.kv)

    def greedy(self, prompts: list[list[int]], max_new_tokens: int) -> tuple[list[list[int]], torch.Tensor]:
        """Batched greedy decoding: one ragged EXTEND of all prompts, then DECODE steps.

        Returns (new token ids per prompt, logits [B, vocab] of the last step).
        """
        rows = [self.new_request() for _ in prompts]
        logits = self.run(ForwardMode.EXTEND, list(zip(rows, prompts)))
        outs: list[list[int]] = [[] for _ in prompts]
        for step in range(max_new_tokens):
            nxt = logits.argmax(-1).tolist()
            for o, t in zip(outs, nxt):
                o.append(t)
            if step + 1 < max_new_tokens:
                logits = self.run(ForwardMode.DECODE, [(r, [t]) for r, t in zip(rows, nxt)])
        return outs, logits


def no_gpu(monkeypatch) -> None:
    """Make torch, in this process, a CUDA build with the NVIDIA driver but no GPU, whatever this
    machine has: a cuda device is then refused as torch tells it ("torch sees no CUDA device"), with
    nothing for ``lmnb_engine.cuda_presence.missing_cuda`` to tell."""
    import lmnb_engine.cuda_presence as presence

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(presence, "DRIVER_LIBRARY", None)  # (not looked for, as off Linux)


def hf_model(path):
    """The transformers reference model of a checkpoint, float32, eval mode."""
    import transformers

    # .float() rather than a dtype argument: transformers 4.x calls it torch_dtype, 5.x dtype.
    return transformers.AutoModelForCausalLM.from_pretrained(path).float().eval()


def hf_greedy(hf, prompt: list[int], max_new_tokens: int) -> list[int]:
    """``generate(do_sample=False)`` for exactly ``max_new_tokens`` tokens (EOS does not stop it)."""
    import transformers

    cfg = transformers.GenerationConfig(
        do_sample=False, max_new_tokens=max_new_tokens, eos_token_id=None, pad_token_id=hf.config.pad_token_id
    )
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                          generation_config=cfg)
    return out[0, len(prompt):].tolist()


def hf_logits(hf, ids: list[int]) -> torch.Tensor:
    """float32 [len(ids), vocab]: HF logits at every position of one sequence."""
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0].float()
