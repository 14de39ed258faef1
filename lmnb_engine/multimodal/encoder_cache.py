"""Vision-encoder outputs per image content hash, least recently used first out.

The radix cache spares the language model an image's tokens once their KV is cached; this cache
spares the vision tower and projector when the KV was evicted (or a new prompt puts a known image
after different text). Keys are the same content hashes the radix keys use.
"""

from __future__ import annotations

from collections import OrderedDict

import torch

DEFAULT_ENCODER_CACHE_BYTES = 512 * 2**20


class EncoderCache:
    """LRU map ``hash -> features`` (a [tokens, hidden] tensor on the model's device).

    Args:
        max_bytes: total tensor bytes kept; older entries go first (0 disables the cache).
    Attributes:
        hits, misses: lookups served / not served (a miss means the image was encoded).
    """

    def __init__(self, max_bytes: int = DEFAULT_ENCODER_CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, torch.Tensor] = OrderedDict()
        self._bytes = 0
        self.hits = 0
        self.misses = 0

    def get(self, key: str) -> torch.Tensor | None:
        """The cached projected features of image ``key`` (marked recently used), or None (a miss)."""
        feats = self._entries.get(key)
        if feats is None:
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return feats

    def put(self, key: str, feats: torch.Tensor) -> None:
        """Cache ``feats`` under ``key`` (not when larger than ``max_bytes`` or already there), evicting
        the least recently used entries to stay within ``max_bytes``."""
        size = feats.numel() * feats.element_size()
        if size > self.max_bytes or key in self._entries:
            return
        self._entries[key] = feats
        self._bytes += size
        while self._bytes > self.max_bytes:
            _, old = self._entries.popitem(last=False)
            self._bytes -= old.numel() * old.element_size()

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        """Drop every entry."""
        self._entries.clear()
        self._bytes = 0
