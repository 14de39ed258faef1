"""lmnb_engine.stop_special: which stop strings stop at a special token."""

from __future__ import annotations


def test_the_stops_that_are_a_skipped_tokens_text_map_to_its_id(tiny_llama):
    """The tiny tokenizer's special tokens (tiny_checkpoint.SPECIAL_TOKENS, ids 0-6 in that order)
    are the ones a decode skipping special tokens leaves out; an added token that is not special
    stays in the text (the stop matcher finds it there), and a string holding a special token's
    text among other text is no token's."""
    from transformers import AutoTokenizer

    from lmnb_engine.stop_special import skipped_tokens, special_stops
    from lmnb_engine.testing.tiny_checkpoint import SPECIAL_TOKENS

    tok = AutoTokenizer.from_pretrained(str(tiny_llama))
    tok.add_tokens(["<plain>"])  # (special=False: decoded in the text)
    plain = tok.convert_tokens_to_ids("<plain>")
    assert skipped_tokens(tok) == {text: (i,) for i, text in enumerate(SPECIAL_TOKENS)}
    stops = ["<|end|>", "x<|end|>", "<plain>", "</s>", "end"]
    assert special_stops(tok, stops, skip_special_tokens=True) == {6: "<|end|>", 1: "</s>"}
    assert special_stops(tok, stops, skip_special_tokens=False) == {}
    assert tok.decode([plain], skip_special_tokens=True) == "<plain>"
