"""Apply packed token bitmasks to a batch of logits, vectorised (no loop over the vocabulary).

Format as in outlines-core / llguidance / xgrammar: int32 words, bit ``i % 32`` of word ``i // 32``
set when token ``i`` is allowed. A row of all ones (-1) leaves its logits unchanged.
"""

from __future__ import annotations

import torch

_SHIFTS: dict[torch.device, torch.Tensor] = {}


def full_bitmask(rows: int, width: int) -> torch.Tensor:
    """int32 [rows, width] bitmask allowing every token (-1 words)."""
    return torch.full((rows, width), -1, dtype=torch.int32)


def apply_token_bitmask_(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """Set disallowed logits to -inf in place and return ``logits``.

    Args:
        logits: float [N, V] on any device.
        bitmask: int32 [N, W] with ``32 * W >= V`` (CPU or the logits' device); tokens at
            ``V <= id < 32 * W`` are ignored.
    Raises:
        ValueError: shapes or dtype do not fit.
    """
    if bitmask.dtype != torch.int32 or bitmask.dim() != 2 or logits.dim() != 2:
        raise ValueError(f"need logits [N, V] and an int32 bitmask [N, W]; got {tuple(logits.shape)} and {bitmask.dtype} {tuple(bitmask.shape)}")
    n, v = logits.shape
    if bitmask.shape[0] != n or bitmask.shape[1] * 32 < v:
        raise ValueError(f"bitmask {tuple(bitmask.shape)} does not cover logits {tuple(logits.shape)}")
    device = logits.device
    shifts = _SHIFTS.get(device)
    if shifts is None:
        shifts = _SHIFTS[device] = torch.arange(32, dtype=torch.int32, device=device)
    words = bitmask.to(device, non_blocking=True)
    allowed = ((words.unsqueeze(-1) >> shifts) & 1).view(n, -1)[:, :v].bool()
    return logits.masked_fill_(~allowed, float("-inf"))
