"""Llama 2's form of tokenizer, built offline for tests and benches: BPE with byte fallback."""

from __future__ import annotations


def byte_fallback_tokenizer():
    """A ``PreTrainedTokenizerFast`` of Llama 2's form with a 265-token vocabulary: BPE with byte
    fallback (a character outside the vocabulary is its UTF-8 bytes, one ``<0xNN>`` token each, ids
    1..256), spaces written "▁", the decoder ``Replace("▁", " ")``, ``ByteFallback``, ``Fuse``,
    ``Strip`` of one leading space, and ``<s>``/``</s>`` as BOS/EOS."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, **{f"<0x{b:02X}>": 1 + b for b in range(256)}}
    for piece in ("▁", "a", "b", "o", "k", "ok", "▁a", "▁ok", "é"):
        vocab[piece] = len(vocab)
    tok = Tokenizer(models.BPE(vocab, [("o", "k"), ("▁", "a"), ("▁", "ok")], byte_fallback=True, unk_token="<unk>"))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.add_special_tokens([AddedToken("<s>", normalized=False), AddedToken("</s>", normalized=False)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
