"""Tokenizer side of a checkpoint: the tokenizer, EOS ids, chat template, generation defaults.

Thin helpers over ``transformers.AutoTokenizer`` and the checkpoint's JSON files; ``load_model``
uses them so that the model code never touches tokenizer files.
"""

from __future__ import annotations

import json
import re
import threading
import weakref
from pathlib import Path
from typing import Any, Callable, Optional

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")

# Keys of generation_config.json that describe how the model's authors want it sampled.
GENERATION_DEFAULT_KEYS = ("do_sample", "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "max_new_tokens")


# a lone UTF-16 surrogate (JSON's "\\ud800" escape parses to one): no Unicode character, so no
# tokenizer or UTF-8 encoder takes it
LONE_SURROGATE = re.compile(r"[\ud800-\udfff]")


def find_lone_surrogate(value: Any) -> Optional[tuple[tuple, bool]]:
    """Where the first lone surrogate is in a parsed JSON ``value`` (strings, lists, dicts), or None.

    Returns:
        ``(path, in_key)``: the keys and list indices from ``value`` down to the string holding it,
        and whether that string is a dict key (the last element of ``path``) rather than a value.
    """
    if isinstance(value, str):
        return ((), False) if LONE_SURROGATE.search(value) else None
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        if isinstance(key, str) and LONE_SURROGATE.search(key):
            return (key,), True
        found = find_lone_surrogate(item)
        if found is not None:
            return (key, *found[0]), found[1]
    return None


def lone_surrogate_problem(text: str, show: Callable[[str], str] = repr) -> Optional[str]:
    """Why no tokenizer can take ``text``, when it holds a lone surrogate (a file read with
    ``errors="surrogateescape"``, half of a ``\\ud83d\\ude00`` pair): the text around it, the
    character, its position and the fix, for the caller to put after what the text is; else None.
    (The tokenizer's own words are "TextEncodeInput must be Union[...]".) ``show`` writes the text
    and the character: Python's ``repr`` for text given in Python, ``json_value`` for a pattern,
    which every other message writes as JSON (the escape, ``"\\ud800"``, either way)."""
    found = LONE_SURROGATE.search(text)
    if found is None:
        return None
    i = found.start()
    return (f"{show(text[max(0, i - 20):i + 20])} holds the lone surrogate {show(found.group())} at position {i}, "
            "which is no Unicode character (text decoded with errors='surrogateescape', or half of a "
            "\\ud83d\\ude00 pair); fix the text, e.g. text.encode('utf-8', 'replace').decode()")


def encode_text(tokenizer: Any, text: str, **kwargs: Any) -> list[int]:
    """``tokenizer.encode(text, **kwargs)`` as a list, for every text the engine encodes.

    Raises:
        ValueError: ``text`` holds a lone surrogate (``lone_surrogate_problem``).
    """
    problem = lone_surrogate_problem(text) if isinstance(text, str) else None
    if problem:
        raise ValueError(f"the text {problem}")
    return list(tokenizer.encode(text, **kwargs))


def without_added_bos(tokenizer: Any, text: str, ids: list[int]) -> list[int]:
    """The token ids a text prompt runs as (``Engine.prompt_ids``; a prompt with images has its
    text read so too): ``ids``, the tokenizer's encoding of ``text``, less the tokenizer's BOS where
    the text writes its own ("<s>..." on a tokenizer that adds one), which would be one too many."""
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is not None and ids[:2] == [bos, bos] and text.startswith(tokenizer.bos_token):
        ids = ids[1:]  # (the text wrote its own BOS: the tokenizer's is one too many)
    return ids


def has_tokenizer(path: Path) -> bool:
    """True if ``path`` holds tokenizer files ``AutoTokenizer`` can load."""
    return any((path / f).is_file() for f in _TOKENIZER_FILES)


def load_tokenizer(path: Path) -> Any:
    """``AutoTokenizer.from_pretrained(path)`` (a ``PreTrainedTokenizerFast``).

    Raises:
        ValueError: the files exist but transformers cannot build a fast tokenizer from them; a
            JSON file that is not a JSON object is named as the cause, and a lone
            ``tokenizer.model`` without the sentencepiece package gets the install command.
    """
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(path))
    except Exception as e:  # transformers raises many types here; name the directory instead
        # A broken JSON file surfaces from deep inside transformers as e.g. "'list' object has no
        # attribute 'get'"; on failure only (a large tokenizer.json costs a parse), name the file.
        for name in ("tokenizer_config.json", "tokenizer.json"):
            read_json(path / name)
        hint = ""
        if (path / "tokenizer.model").exists() and not (path / "tokenizer.json").exists():
            import importlib.util

            if importlib.util.find_spec("sentencepiece") is None:  # transformers' error then names tiktoken
                hint = ("; the checkpoint has only a SentencePiece tokenizer.model, which needs the sentencepiece "
                        "package to convert: pip install sentencepiece")
        raise ValueError(f"could not load the tokenizer in {path}: {type(e).__name__}: {e}{hint}") from None


_LFS_POINTER = b"version https://git-lfs.github.com/spec/"


def lfs_pointer_fix(path: Path) -> str | None:
    """If ``path`` is a Git LFS pointer (a repository cloned without Git LFS: a few lines of text
    in place of the file), what to do about it; else None."""
    try:
        with open(path, "rb") as f:
            head = f.read(len(_LFS_POINTER))
    except OSError:  # unreadable: the caller's own message names the problem
        return None
    if head != _LFS_POINTER:
        return None
    return (f"{path} is a Git LFS pointer, not the file itself (the repository was cloned without Git "
            f"LFS); run `git lfs install && git lfs pull` in {path.parent}, or download with `hf download`")


def read_json(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``, or ``{}`` if the file does not exist.

    Raises:
        ValueError: the file is not a JSON object (the message names the file and where it breaks),
            or is a Git LFS pointer (the message says how to fetch the file).
    """
    if not path.is_file():
        return {}
    with open(path, encoding="utf-8") as f:
        try:
            data = json.load(f)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            invalid = f"{path} is not valid JSON ({e}); fix or re-save the file"
            raise ValueError(lfs_pointer_fix(path) or invalid) from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} holds a JSON {type(data).__name__}, not an object; fix or re-save the file")
    return data


def _as_ids(v: Any) -> set[int]:
    if v is None:
        return set()
    return {int(x) for x in v} if isinstance(v, (list, tuple)) else {int(v)}


def eos_token_ids(tokenizer: Any, generation_config: dict[str, Any]) -> frozenset[int]:
    """Union of ``generation_config.json``'s ``eos_token_id`` (int or list) and the tokenizer's EOS."""
    return frozenset(_as_ids(generation_config.get("eos_token_id")) | _as_ids(tokenizer.eos_token_id))


def chat_template(tokenizer: Any, path: Path) -> str | None:
    """The chat template: the tokenizer's (tokenizer_config.json or chat_template.jinja), else the
    ``chat_template.jinja`` file itself (older transformers do not read it); None if there is none.

    A list of named templates (transformers' multi-template format) yields the one named "default".
    """
    t = tokenizer.chat_template
    if isinstance(t, dict):
        t = t.get("default")
    elif isinstance(t, list):
        t = next((x["template"] for x in t if x.get("name") == "default"), None)
    if t is None and (path / "chat_template.jinja").is_file():
        t = (path / "chat_template.jinja").read_text(encoding="utf-8")
    return t


def generation_defaults(generation_config: dict[str, Any]) -> dict[str, Any]:
    """The sampling keys (``GENERATION_DEFAULT_KEYS``) present in generation_config.json."""
    return {k: generation_config[k] for k in GENERATION_DEFAULT_KEYS if k in generation_config}


def covered_chars(engine: Any, text: str, n_tokens: int) -> int:
    """The characters of ``text`` that the first ``n_tokens`` tokens of its encoding cover (what a
    cache hit of ``n_tokens`` prompt tokens means in the text a user wrote): ``text`` is encoded as
    the engine runs a prompt (``engine.prompt_ids``; a bare tokenizer's ``encode``, where that is
    what ``engine`` is), the tokens encoding adds before any text (a
    BOS, counted in ``cached_tokens`` but not in ``text``; none where the text writes its own BOS,
    which ``prompt_ids`` keeps in their place: "<s>hi" counted its BOS's 3 characters short) are
    passed over, and the rest are decoded back with their special tokens, which a chat prompt's text
    holds (``<|user|>``). Exact for byte-level BPE tokenizers; a token cut inside a character counts
    that character."""
    encoded = list(engine.encode(text))
    ids = list(engine.prompt_ids(text)) if hasattr(engine, "prompt_ids") else encoded
    added = list(engine.encode(""))
    start = len(added) if ids[: len(added)] == added and ids == encoded else 0
    return min(len(engine.decode(ids[start : max(n_tokens, start)], skip_special_tokens=False)), len(text))


# How many UTF-8 bytes of text NFC normalization (Qwen's tokenizers) may turn into one byte:
# U+0390 (2 bytes) is the NFC form of U+1FBE U+0308 U+0341 (7 bytes); no character is the form of
# more per byte of it (unicodedata 14, worked out in tests/test_tokenizer_bound.py). 4 leaves room
# for a Unicode version between the tokenizers library's and Python's.
NFC_SHRINK = 4

_MAX_TOKEN_BYTES: "weakref.WeakKeyDictionary[Any, Optional[int]]" = weakref.WeakKeyDictionary()
_MAX_TOKEN_BYTES_LOCK = threading.Lock()


def max_token_bytes(tokenizer: Any) -> Optional[int]:
    """The most UTF-8 bytes of a text that one token of ``tokenizer`` can stand for, or None where
    no bound is known to hold; worked out once per tokenizer.

    A text of B bytes then encodes to at least B / (this) tokens. That holds where every byte of
    the text ends up in some token and a token stands for no more bytes than its own, which is
    checked here, not assumed (any other tokenizer gets None):

    * the model is BPE that never drops or fuses what it does not know: byte-level (GPT-2, Llama
      3, Qwen; every byte a token of the vocabulary) or with byte fallback (Llama 2, Mistral;
      every ``<0xNN>`` in the vocabulary), so no ``<unk>`` stands for a run of text;
    * the pre-tokenizer splits without dropping anything (a ``Whitespace`` split drops spaces);
    * the normalizer only adds (``Prepend``), replaces a string by one no shorter (Llama 2's " " ->
      "▁"), or is NFC (Qwen), which turns at most
      ``NFC_SHRINK`` bytes into one; NFKC, lowercasing, stripping may shrink a text without bound;
    * no added token strips the whitespace beside it (``lstrip``/``rstrip``), which would make it
      stand for any amount of text.

    A token's bytes are those of its string (an added token's: BOS, ``<|im_start|>``, matched in
    the text), byte-level ones read with GPT-2's byte->unicode table and ``<0xNN>`` as one byte. A
    "▁" counts its own 3 bytes, not the space it stands for: a text may hold the character itself,
    which Llama 2's tokenizer reads as a space.
    """
    with _MAX_TOKEN_BYTES_LOCK:
        if tokenizer not in _MAX_TOKEN_BYTES:
            try:
                _MAX_TOKEN_BYTES[tokenizer] = _max_token_bytes(tokenizer)
            except TypeError:  # not weak-referenceable: worked out on every call
                return _max_token_bytes(tokenizer)
        return _MAX_TOKEN_BYTES[tokenizer]


def _types(spec: Optional[dict], key: str) -> list[dict]:
    """The components of a tokenizer.json normalizer or pre-tokenizer ``spec``, ``Sequence``s flattened."""
    if not spec:
        return []
    if spec.get("type") == "Sequence":
        return [c for s in spec.get(key) or [] for c in _types(s, key)]
    return [spec]


def _max_token_bytes(tokenizer: Any) -> Optional[int]:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    spec = json.loads(backend.to_str())
    model = spec.get("model") or {}
    vocab = model.get("vocab")
    if model.get("type") != "BPE" or not isinstance(vocab, dict):
        return None
    pre = _types(spec.get("pre_tokenizer"), "pretokenizers")
    if any(p.get("type") not in ("ByteLevel", "Metaspace", "Digits", "Split", "Punctuation", "UnicodeScripts")
           or p.get("behavior") == "Removed" for p in pre):
        return None
    # (bytes that occur in UTF-8 text: all but C0, C1 and F5-FF)
    utf8_bytes = [b for b in range(256) if b not in (0xC0, 0xC1) and b < 0xF5]
    if any(p.get("type") == "ByteLevel" for p in pre):
        from transformers.convert_slow_tokenizer import bytes_to_unicode

        to_char = bytes_to_unicode()
        char_to_byte = {c: b for b, c in to_char.items()}
        if any(to_char[b] not in vocab for b in utf8_bytes):
            return None

        def size(token: str) -> int:  # (a string off the byte table: its UTF-8 length, no less)
            return len(token) if all(c in char_to_byte for c in token) else len(token.encode())
    elif model.get("byte_fallback"):
        if any(f"<0x{b:02X}>" not in vocab for b in utf8_bytes):
            return None

        def size(token: str) -> int:
            return 1 if _BYTE_TOKEN.fullmatch(token) else len(token.encode())
    else:
        return None
    for n in _types(spec.get("normalizer"), "normalizers"):
        kind = n.get("type")
        if kind == "Replace":
            pattern = (n.get("pattern") or {}).get("String")
            if pattern is None or len((n.get("content") or "").encode()) < len(pattern.encode()):
                return None
        elif kind not in ("Prepend", "NFC"):
            return None
    added = spec.get("added_tokens") or []
    if any(t.get("lstrip") or t.get("rstrip") for t in added):
        return None
    longest = max([size(t) for t in vocab] + [len(t.get("content", "").encode()) for t in added])
    nfc = any(n.get("type") == "NFC" for n in _types(spec.get("normalizer"), "normalizers"))
    return longest * NFC_SHRINK if nfc else longest


_BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")


def min_prompt_tokens(text: str, tokenizer: Any, context_len: int) -> int:
    """A lower bound on the tokens ``text`` encodes to, without encoding it: its UTF-8 bytes over
    ``max_token_bytes``; 0 where the tokenizer has no known bound. Only a text of more than
    ``context_len`` bytes is measured (a shorter one cannot be shown too long so), so most
    prompts cost no look at the vocabulary."""
    if len(text) * 4 <= context_len:  # (at most 4 bytes a character)
        return 0
    size = len(text.encode("utf-8", "surrogatepass"))
    per_token = max_token_bytes(tokenizer) if size > context_len else None
    return -(-size // per_token) if per_token else 0


def text_too_long(text: str, tokenizer: Any, context_len: int) -> Optional[tuple[str, int]]:
    """Why the prompt ``text`` cannot fit ``context_len`` tokens, found without encoding it (a
    20 MB text took 20 s to encode, to be refused then), and the lower bound on its tokens that
    says so (``min_prompt_tokens``), for the caller's fix to say by how much to shorten it at
    least (``params.past_context_refusal``'s ``prompt_len``); or None when that is not certain."""
    at_least = min_prompt_tokens(text, tokenizer, context_len)
    if at_least <= context_len:
        return None
    return (f"prompt of at least {at_least} tokens ({len(text)} characters, counted without encoding them) exceeds "
            f"the model's context length of {context_len} tokens", at_least)
