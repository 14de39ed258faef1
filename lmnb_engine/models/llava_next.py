"""LLaVA-NeXT (``LlavaNextForConditionalGeneration``): LLaVA with any-resolution tiling.

Follows transformers' ``LlavaNextModel`` (Liu et al., "LLaVA-NeXT: Improved reasoning, OCR, and
world knowledge", 2024; ``mm_patch_merge_type="spatial_unpad"``): the image processor gives a
downscaled base tile plus the tiles of the best-fitting grid from ``image_grid_pinpoints``; each
tile goes through the vision tower and projector; the grid tiles' features are laid out as one
feature map, cropped back to the image's aspect ratio (``unpad_image``), an ``image_newline``
vector closes every row, and the base tile's features come first. The grid helpers are
transformers' own (``get_anyres_image_grid_shape``, ``unpad_image``).
"""

from __future__ import annotations

import torch
from torch import nn

from lmnb_engine.model_config import ModelConfig
from lmnb_engine.models.llava import LlavaForConditionalGeneration


class LlavaNextForConditionalGeneration(LlavaForConditionalGeneration):
    """``LlavaForConditionalGeneration`` whose images are tiled (see the module docstring).

    Each ``ImageSlot`` carries ``pixel_values`` [num_tiles, 3, H, W] and ``image_size`` (h, w).
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        mm = config.multimodal_hf_config
        self.grid_pinpoints = mm.image_grid_pinpoints
        self.tile_size = mm.vision_config.image_size
        self.tile_side = mm.vision_config.image_size // mm.vision_config.patch_size
        self.image_newline = nn.Parameter(torch.empty(config.hidden_size))

    @torch.no_grad()
    def encode_slots(self, slots: list) -> list[torch.Tensor]:
        """[tokens, hidden] per slot: all tiles of all slots in one vision-tower batch, then packed."""
        tiles = self.encode_images(torch.cat([s.pixel_values for s in slots]))
        out, at = [], 0
        for s in slots:
            n = s.pixel_values.shape[0]
            out.append(self._pack(tiles[at : at + n], s.image_size))
            at += n
        return out

    def _pack(self, feats: torch.Tensor, image_size: tuple[int, int]) -> torch.Tensor:
        """feats [num_tiles, side*side, hidden] of one image -> [tokens, hidden] (HF's pack_image_features)."""
        from transformers.models.llava_next.modeling_llava_next import get_anyres_image_grid_shape, unpad_image

        newline = self.image_newline.to(feats.dtype)
        if feats.shape[0] == 1:  # no grid: the base tile and one newline
            return torch.cat([feats[0], newline[None]], dim=0)
        base, grid = feats[0], feats[1:]
        rows, cols = get_anyres_image_grid_shape(image_size, self.grid_pinpoints, self.tile_size)
        side = self.tile_side
        grid = grid.view(rows, cols, side, side, -1).permute(4, 0, 2, 1, 3).flatten(1, 2).flatten(2, 3)
        grid = unpad_image(grid, torch.tensor(image_size))  # [hidden, h, w] cropped to the aspect ratio
        grid = torch.cat([grid, newline[:, None, None].expand(*grid.shape[:-1], 1)], dim=-1)
        return torch.cat([base, grid.flatten(1, 2).transpose(0, 1)], dim=0)
