"""The LookWhere selector: a shallow ViT on a low-resolution copy of the image that
predicts a score for every patch of the high-resolution grid (where to look), and whose
prefix tokens the extractor starts from. Torch alone."""

from __future__ import annotations

import math
from typing import Any, Dict, Optional, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from ..lookhere.vit import create_model, image_size_pair, trunc_normal_

__all__ = ['LookWhereSelector', 'SelectorHead']


class SelectorHead(nn.Module):
    """Two-layer MLP from a low-resolution patch token to ``r * r`` scores of the
    high-resolution patches under it (parameter names ``w1``, ``w2`` as the official).

    Args:
        embed_dims: token channels.
        num_outputs: ``r * r``.
        hidden_ratio: hidden / token channels. Default: 4.
    """

    def __init__(self, embed_dims: int, num_outputs: int, hidden_ratio: float = 4.0):
        super().__init__()
        hidden = int(embed_dims * hidden_ratio)
        self.w1 = nn.Linear(embed_dims, hidden)
        self.w2 = nn.Linear(hidden, num_outputs)

    def forward(self, x: Tensor) -> Tensor:
        """``(B, n, D)`` -> ``(B, n, r*r)``."""
        return self.w2(F.gelu(self.w1(x)))


class LookWhereSelector(nn.Module):
    """Low-resolution ViT + score head (the official selector: 3 blocks at a fixed size).

    The image is resized (bilinear) to ``input_size`` (or by ``input_scale``), run through
    a trunk of our LookHere ViT (any of its position encodings; ``'abs'`` for the official
    DINOv2 layout), and each low-resolution patch token predicts ``r x r`` scores; the
    ``(h*r, w*r)`` score map is resized (bilinear) to the high-resolution grid.

    Args:
        input_size (int | tuple, optional): the fixed low resolution ``(H, W)``, a
            multiple of ``patch_size`` on each side. Default: ``(64, 64)``.
        input_scale (float, optional): instead of ``input_size``, resize by this factor
            (the low resolution follows the input's aspect ratio, each side rounded to
            whole patches). Default: None.
        embed_dims (int): Default: 192.
        num_layers (int): Default: 3.
        num_heads (int): Default: 12.
        patch_size (int): Default: 16.
        num_registers (int): register tokens after CLS (the official DINOv2 selector has
            4); CLS and registers are the prefix tokens handed to the extractor.
            Default: 0.
        score_multiplier (int): ``r``, scores per low-resolution patch side. Default: 2.
        **trunk: other :class:`~lookhere_dense.lookhere.LookHereVisionTransformer`
            arguments (``preset``, ``pos_encoding``, ``init_values``, ``norm_layer``, ...).
    """

    def __init__(
        self,
        input_size: Union[None, int, Tuple[int, int]] = (64, 64),
        input_scale: Optional[float] = None,
        embed_dims: int = 192,
        num_layers: int = 3,
        num_heads: int = 12,
        patch_size: int = 16,
        num_registers: int = 0,
        score_multiplier: int = 2,
        **trunk: Any,
    ):
        super().__init__()
        if input_scale is not None:
            if isinstance(input_scale, bool) or not 0 < float(input_scale) <= 1:
                raise ValueError(
                    f'LookWhere selector: input_scale={input_scale!r} is outside (0, 1]'
                )
            self.input_size = None
        else:
            if input_size is None:
                raise ValueError('LookWhere selector: give input_size or input_scale')
            self.input_size = image_size_pair(input_size)
        self.input_scale = None if input_scale is None else float(input_scale)
        if (
            isinstance(score_multiplier, bool)
            or not isinstance(score_multiplier, int)
            or score_multiplier < 1
        ):
            raise ValueError(
                f'LookWhere selector: score_multiplier must be an int >= 1, got {score_multiplier!r}'
            )
        if (
            isinstance(num_registers, bool)
            or not isinstance(num_registers, int)
            or num_registers < 0
        ):
            raise ValueError(
                f'LookWhere selector: num_registers must be an int >= 0, got {num_registers!r}'
            )
        for bad in ('with_cls_token', 'jumbo_tokens', 'window_size', 'out_indices'):
            if bad in trunk:
                raise ValueError(
                    f'LookWhere selector: {bad} is set by the selector, not configurable'
                )
        if trunk.get('log_n_scaling'):  # its block loop has no attention scale
            raise ValueError('LookWhere selector: log_n_scaling is not supported')
        img_size = self.input_size or (224, 224)
        self.backbone = create_model(
            img_size=img_size,
            patch_size=patch_size,
            embed_dims=embed_dims,
            num_layers=num_layers,
            num_heads=num_heads,
            **trunk,
        )
        patch = image_size_pair(self.backbone.patch_size)
        if self.input_size is not None and any(s % q for s, q in zip(self.input_size, patch)):
            nearest = tuple(_whole_patches(s, q) for s, q in zip(self.input_size, patch))
            raise ValueError(
                f'LookWhere selector: input_size={self.input_size} is not a multiple of '
                f'patch_size={patch_size}: its patch grid would cover zero padding at the '
                f'bottom and right, and its score map would not line up with the image; '
                f'use e.g. input_size={nearest}'
            )
        self.num_registers = num_registers
        self.reg_token = (
            nn.Parameter(torch.zeros(1, num_registers, embed_dims)) if num_registers else None
        )
        if self.reg_token is not None:
            trunc_normal_(self.reg_token, std=0.02)
        self.score_multiplier = score_multiplier
        self.head = SelectorHead(embed_dims, score_multiplier * score_multiplier)
        self.embed_dims = embed_dims

    @property
    def num_prefix_tokens(self) -> int:
        """CLS + registers: the prefix tokens the extractor receives."""
        return 1 + self.num_registers

    def low_res_size(self, size: Tuple[int, int]) -> Tuple[int, int]:
        """The selector's input size for an image of ``size`` ``(H, W)``: ``input_size``,
        or each side times ``input_scale`` rounded to whole patches (at least one), so that
        the patch grid, and the score map, cover the image and no padding."""
        if self.input_size is not None:
            return self.input_size
        patch = image_size_pair(self.backbone.patch_size)
        return tuple(_whole_patches(s * self.input_scale, q) for s, q in zip(size, patch))

    def forward(self, images: Tensor, target_grid: Tuple[int, int]) -> Dict[str, Tensor]:
        """``images (B, C, H, W)`` -> dict with

        * ``scores``: ``(B, Ht * Wt)`` one score per patch of ``target_grid`` (row-major);
        * ``prefix_tokens``: ``(B, 1 + R, D)`` CLS and registers after the last block;
        * ``patch_tokens``: ``(B, h * w, D)`` the low-resolution patch tokens;
        * ``grid``: ``(h, w)`` the low-resolution grid (a tuple, not a tensor).
        """
        trunk = self.backbone
        low = self.low_res_size(tuple(images.shape[-2:]))
        x = F.interpolate(images, size=low, mode='bilinear', align_corners=False)
        x, grid = trunk.patch_embed(x)
        x = trunk.pos_enc.add_to_tokens(x, grid)
        prefix = [trunk.cls_token.expand(x.shape[0], -1, -1)]
        if self.reg_token is not None:
            prefix.append(self.reg_token.expand(x.shape[0], -1, -1))
        x = torch.cat(prefix + [x], dim=1)
        x = trunk.drop_after_pos(x)
        if trunk.pre_ln is not None:
            x = trunk.pre_ln(x)
        j = self.num_prefix_tokens
        for i, blk in enumerate(trunk.blocks):
            x = blk(x, trunk.pos_enc, i, grid, j)
        if trunk.norm is not None:
            x = trunk.norm(x)
        patches = x[:, j:]
        r = self.score_multiplier
        b = x.shape[0]
        s = self.head(patches).reshape(b, grid[0], grid[1], r, r)
        s = s.permute(0, 1, 3, 2, 4).reshape(b, 1, grid[0] * r, grid[1] * r)
        if tuple(s.shape[-2:]) != tuple(target_grid):
            s = F.interpolate(s, size=tuple(target_grid), mode='bilinear', align_corners=False)
        return {
            'scores': s.flatten(1),
            'prefix_tokens': x[:, :j],
            'patch_tokens': patches,
            'grid': grid,
        }


def _whole_patches(side: float, patch: int) -> int:
    """``side`` rounded to the nearest multiple of ``patch`` (halves up), at least one."""
    return max(patch, patch * math.floor(side / patch + 0.5))


def official_multiplier(input_grid: int, reference_grid: int = 37) -> int:
    """The official ``r``: ``ceil(37 / input_grid)`` (37 = 518 / 14, its pre-training grid)."""
    return math.ceil(reference_grid / input_grid)
