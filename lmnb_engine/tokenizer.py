"""Tokenizer side of a checkpoint: the tokenizer, EOS ids, chat template, generation defaults.

Thin helpers over ``transformers.AutoTokenizer`` and the checkpoint's JSON files; ``load_model``
uses them so that the model code never touches tokenizer files.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Optional

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
    ``engine.encode`` encodes a prompt, the tokens encoding adds before any text (a BOS, counted
    in ``cached_tokens`` but not in ``text``) are passed over, and the rest are decoded back with
    their special tokens, which a chat prompt's text holds (``<|user|>``). Exact for byte-level BPE
    tokenizers; a token cut inside a character counts that character."""
    ids = list(engine.encode(text))
    added = list(engine.encode(""))
    start = len(added) if ids[: len(added)] == added else 0
    return min(len(engine.decode(ids[start : max(n_tokens, start)], skip_special_tokens=False)), len(text))
