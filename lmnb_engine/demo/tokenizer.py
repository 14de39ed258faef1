"""Byte-level BPE tokenizer and chat template of the demo model.

Trained with the ``tokenizers`` library on the demo corpus. Digits are split one per token
(as Llama's tokenizer does) so the number-line tasks are learnable digit by digit. Plain text is
encoded with BOS prepended (a ``TemplateProcessing`` post-processor, like Llama); chat text gets
its BOS from the chat template instead, so render it with ``apply_chat_template`` and encode
with ``add_special_tokens=False``.
"""

from __future__ import annotations

from collections.abc import Iterable

BOS, EOS, PAD = "<s>", "</s>", "<pad>"
ROLE_TOKENS = {"system": "<|system|>", "user": "<|user|>", "assistant": "<|assistant|>"}
SPECIAL_TOKENS = [BOS, EOS, PAD, *ROLE_TOKENS.values()]

# Every turn is "<|role|>" + content + EOS, so EOS ends assistant replies (generation stops there)
# and rendering a prefix of a conversation gives a prefix of the rendered whole (the property the
# radix cache and the language's incremental role rendering rely on). ``add_bos=False`` renders
# without BOS, for appending turns to an already rendered conversation. Unknown roles are an error.
CHAT_TEMPLATE = (
    "{% if add_bos is not defined or add_bos %}{{ bos_token }}{% endif %}"
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unknown chat role ' ~ message['role'] ~ '; use system, user or assistant') }}"
    "{% endif %}"
    "{{ '<|' ~ message['role'] ~ '|>' ~ message['content'] ~ eos_token }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


def train_tokenizer(texts: Iterable[str], vocab_size: int = 2048):
    """Train and return a ``transformers.PreTrainedTokenizerFast`` on ``texts``.

    Byte-level BPE (all 256 byte symbols are in the vocabulary, so any Unicode text encodes),
    special tokens ``SPECIAL_TOKENS`` at ids 0..5 (BOS=0, EOS=1, PAD=2), and ``CHAT_TEMPLATE``.
    ``vocab_size`` is an upper bound: training stops early when no pair is left to merge.
    """
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, tok.token_to_id(BOS))]
    )
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        additional_special_tokens=list(ROLE_TOKENS.values()),
        chat_template=CHAT_TEMPLATE,
        model_max_length=512,
    )
