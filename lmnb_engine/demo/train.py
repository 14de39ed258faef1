"""Train the demo model from scratch on CPU and write a Hugging Face checkpoint directory.

    python -m lmnb_engine.demo.train --out lmnb_engine/demo_model --seed 0

Plain torch: the synthetic corpus (``corpus.training_documents``) is tokenized, packed into one
token stream and cut into random windows; a ``transformers.LlamaForCausalLM`` is trained with
AdamW, linear warmup and cosine decay, for a fixed number of steps (so the run, not the wall
clock, decides the result). The output directory holds config.json, model.safetensors (fp32),
generation_config.json and the tokenizer files; ``AutoModelForCausalLM.from_pretrained`` and
``lmnb_engine`` load it.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import time
from pathlib import Path

from lmnb_engine.demo import corpus
from lmnb_engine.demo.tokenizer import train_tokenizer

MODEL_SHAPE = dict(
    hidden_size=256,
    intermediate_size=768,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=4,
    max_position_embeddings=512,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    tie_word_embeddings=True,
)


def encode_documents(tok, docs: list[corpus.Document]) -> list[int]:
    """Token ids of all documents, concatenated: plain text as BOS+text+EOS, chats via the template."""
    plain = [d.text for d in docs if not d.messages]
    plain_ids = iter(tok(plain, add_special_tokens=True)["input_ids"])
    stream: list[int] = []
    for d in docs:
        if d.messages:
            text = tok.apply_chat_template(list(d.messages), tokenize=False)
            stream += tok(text, add_special_tokens=False)["input_ids"]
        else:
            stream += next(plain_ids) + [tok.eos_token_id]
    return stream


def make_tokenizer_config_portable(out: Path) -> None:
    """Rewrite ``out/tokenizer_config.json`` in the form transformers 4.x and 5.x both load.

    transformers 5 writes ``tokenizer_class: TokenizersBackend`` and a list under
    ``extra_special_tokens``, which 4.x does not know; the role tokens are marked special in
    tokenizer.json either way.
    """
    path = out / "tokenizer_config.json"
    cfg = json.loads(path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    if isinstance(cfg.get("extra_special_tokens"), list):
        cfg["additional_special_tokens"] = cfg.pop("extra_special_tokens")
    for key in ("is_local", "local_files_only"):  # facts about one load, not about the tokenizer
        cfg.pop(key, None)
    path.write_text(json.dumps(cfg, indent=2) + "\n")


def lr_at(step: int, steps: int, peak: float, warmup: int) -> float:
    """Linear warmup to ``peak`` over ``warmup`` steps, then cosine decay to ``peak / 10``."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def train(out: Path, seed: int, steps: int, batch_size: int, seq_len: int, lr: float,
          n_docs: int, threads: int) -> dict:
    """Build corpus, tokenizer and model; train; save to ``out``. Returns a summary dict."""
    import torch
    import transformers

    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    t0 = time.time()
    docs = corpus.training_documents(seed, n_docs)
    tok_texts = [d.text or " ".join(m["content"] for m in d.messages) for d in docs]
    tok = train_tokenizer(tok_texts)
    stream = torch.tensor(encode_documents(tok, docs), dtype=torch.long)
    print(f"corpus: {len(docs)} docs, {len(stream)} tokens, vocab {len(tok)}; "
          f"{time.time() - t0:.1f}s", flush=True)

    config = transformers.LlamaConfig(
        vocab_size=len(tok), bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id, **MODEL_SHAPE)
    model = transformers.LlamaForCausalLM(config)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params / 1e6:.2f}M parameters", flush=True)

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95), eps=1e-8)
    gen = torch.Generator().manual_seed(seed)
    warmup = max(1, steps // 20)
    model.train()
    t_train = time.time()
    for step in range(steps):
        starts = torch.randint(0, len(stream) - seq_len - 1, (batch_size,), generator=gen)
        batch = torch.stack([stream[s:s + seq_len] for s in starts.tolist()])
        for g in opt.param_groups:
            g["lr"] = lr_at(step, steps, lr, warmup)
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % 50 == 0 or step == steps - 1:
            el = time.time() - t_train
            print(f"step {step}/{steps} loss {loss.item():.4f} lr {opt.param_groups[0]['lr']:.2e} "
                  f"{el:.0f}s {(step + 1) * batch_size * seq_len / el:.0f} tok/s", flush=True)
    train_s = time.time() - t_train

    model.eval()
    model.generation_config = transformers.GenerationConfig(
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id, do_sample=False, max_new_tokens=64)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    # Template inside tokenizer_config.json (not chat_template.jinja) so transformers 4.x reads it too.
    tok.save_pretrained(out, save_jinja_files=False)
    make_tokenizer_config_portable(out)
    summary = dict(
        seed=seed, steps=steps, batch_size=batch_size, seq_len=seq_len, peak_lr=lr, n_docs=n_docs,
        corpus_tokens=len(stream), trained_tokens=steps * batch_size * seq_len,
        vocab_size=len(tok), parameters=n_params, final_loss=round(loss.item(), 4),
        train_seconds=round(train_s, 1), total_seconds=round(time.time() - t0, 1),
        threads=threads, torch=torch.__version__, transformers=transformers.__version__,
        machine=f"{platform.machine()} {platform.processor() or ''}".strip(),
    )
    (out / "training_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary), flush=True)
    return summary


def main(argv: list[str] | None = None) -> None:
    """Command line: train the demo model and write the checkpoint to ``--out``."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True, help="checkpoint directory to write")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=1200)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--n-docs", type=int, default=60000)
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    a = p.parse_args(argv)
    train(a.out, a.seed, a.steps, a.batch_size, a.seq_len, a.lr, a.n_docs, a.threads)


if __name__ == "__main__":
    main()
