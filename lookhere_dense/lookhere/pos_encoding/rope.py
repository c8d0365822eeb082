"""``'rope2d'`` and ``'rope2d_mixed'``: 2D rotary position embeddings (RoPE-ViT's axial and
mixed variants, written here and proven equal to timm's in the tests)."""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Tuple, Union

import torch
import torch.nn as nn
from torch import Tensor

from lookhere_dense.validation import check_number

from ..cache import BoundedCache
from ..prefix_tokens import check_tokens, num_prefix_tokens
from .base import PositionEncoding, Trunk

__all__ = [
    'AxialRoPE2d',
    'MixedRoPE2d',
    'rotate_half_pairs',
    'rotate_patch_tokens',
    'patch_coordinates',
]


def rotate_half_pairs(x: Tensor, angles: Tensor) -> Tensor:
    """Rotate channel pairs ``(x[..., j], x[..., j + d/2])`` by ``angles[..., j]``.

    Args:
        x: ``(..., N, d)`` with even ``d``.
        angles: ``(..., N, d/2)``, broadcastable against ``x``'s leading dims.

    Returns:
        Same shape and dtype as ``x``.
    """
    half = x.shape[-1] // 2
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


def rotate_patch_tokens(
    q: Tensor,
    k: Tensor,
    grid_size: Tuple[int, int],
    cls_token: Union[bool, int],
    rotate: Callable[[Tensor], Tensor],
) -> Tuple[Tensor, Tensor]:
    """``rotate`` applied to the patch tokens of ``q`` and ``k`` ``(B, heads, J + H*W, d)``;
    the ``J = cls_token`` global prefix tokens in front (CLS or Jumbo tokens, True = 1) pass
    unrotated. ``rotate``: ``(B, heads, H*W, d)`` -> the same shape.

    Raises:
        ValueError: ``q`` has other than ``J + H*W`` tokens for ``grid_size = (H, W)``.
    """
    off = num_prefix_tokens(cls_token)
    check_tokens('RoPE', q.shape[-2], grid_size, off)
    out = []
    for t in (q, k):
        rotated = rotate(t[:, :, off:])
        out.append(torch.cat([t[:, :, :off], rotated], dim=2) if off else rotated)
    return out[0], out[1]


def patch_coordinates(
    grid_size: Tuple[int, int], device: Union[torch.device, str, None] = None
) -> Tuple[Tensor, Tensor]:
    """Row and column index of every patch, row-major: two float32 ``(H*W,)`` tensors."""
    ys, xs = torch.meshgrid(
        torch.arange(grid_size[0], device=device, dtype=torch.float32),
        torch.arange(grid_size[1], device=device, dtype=torch.float32),
        indexing='ij',
    )
    return ys.flatten(), xs.flatten()


class _RoPE2dBase(PositionEncoding):
    """RoPE on the patch tokens (the global prefix tokens in front, CLS or Jumbo tokens,
    are not rotated)."""

    def angles(self, layer: int, grid_size: Tuple[int, int], device: torch.device) -> Tensor:
        """Rotation angles ``(heads or 1, H*W, head_dim/2)`` of ``layer`` (float32)."""
        raise NotImplementedError

    def rotate(
        self,
        q: Tensor,
        k: Tensor,
        layer: int,
        grid_size: Tuple[int, int],
        cls_token: Union[bool, int],
    ) -> Tuple[Tensor, Tensor]:
        ang = self.angles(layer, tuple(grid_size), q.device)
        return rotate_patch_tokens(q, k, grid_size, cls_token, lambda t: rotate_half_pairs(t, ang))


class AxialRoPE2d(_RoPE2dBase):
    """``'rope2d'``: axial 2D rotary embedding (RoPE-Axial of Heo et al. 2024).

    For head channels ``d``, ``d/4`` frequencies ``f_i = theta ** (-4i / d)``; the first
    ``d/4`` channel pairs rotate by ``x * f_i`` (column), the next ``d/4`` by ``y * f_i``
    (row), positions in patches. The same for every head and layer; no parameters.
    Larger grids simply use larger positions (no interpolation). Channel pairs are
    ``(j, j + d/2)`` ("half" layout).

    The same rotation as RoPE-ViT's axial RoPE and timm's ``RotaryEmbeddingCat(dim=d,
    in_pixels=False, temperature=theta, grid_indexing='xy')`` (timm's
    ``vit_base_patch16_rope_224``): equal angles per pair; those interleave the pairs as
    ``(2j, 2j + 1)``, so weights trained there load here after moving q / k channel
    ``2j -> j`` and ``2j + 1 -> j + d/2`` in every head (``tests/test_pos_encoding_timm.py``
    proves the attention logits equal).

    Args:
        head_dim: channels per head (multiple of 4).
        theta: frequency base. Default: 100 (RoPE-ViT's axial setting).
    """

    name = 'rope2d'
    options = ('theta',)

    def __init__(self, head_dim: int, theta: float = 100.0):
        super().__init__()
        if head_dim % 4:
            raise ValueError(
                f"pos_encoding='rope2d' needs head channels divisible by 4 "
                f'(embed_dims / num_heads), got {head_dim}'
            )
        self.head_dim = head_dim
        self.theta = check_number('pos_encoding theta', theta, 0, strict=True)
        self._cache = BoundedCache(8)

    @classmethod
    def from_spec(cls, options: Mapping[str, Any], trunk: Trunk, **spec: Any) -> 'AxialRoPE2d':
        return cls(trunk.head_dim, **options)

    def frequencies(self) -> Tensor:
        """``(head_dim/4,)`` float32 frequencies."""
        return (
            self.theta
            ** (-torch.arange(0, self.head_dim, 4, dtype=torch.float64) / self.head_dim).float()
        )

    def angles(self, layer: int, grid_size: Tuple[int, int], device: torch.device) -> Tensor:
        def make() -> Tensor:
            ys, xs = patch_coordinates(grid_size, device)
            freqs = self.frequencies().to(device)
            return torch.cat([xs[:, None] * freqs, ys[:, None] * freqs], dim=-1)[None]

        return self._cache.get_or_create((grid_size, str(device)), make)

    def clear_caches(self) -> None:
        """Drop the cached rotation angles."""
        self._cache.clear()

    def extra_repr(self) -> str:
        return f'name={self.name!r}, head_dim={self.head_dim}, theta={self.theta}'


class MixedRoPE2d(_RoPE2dBase):
    """``'rope2d_mixed'``: RoPE-Mixed (Heo et al. 2024), learnable 2D frequencies.

    Channel pair ``j`` of head ``h`` in layer ``l`` rotates by
    ``fx[l, h, j] * x + fy[l, h, j] * y``. Initialisation: magnitudes
    ``theta ** (-4i / d)`` for ``i < d/4``, each used twice, at directions ``phi`` and
    ``phi + pi/2`` with a random ``phi`` per layer and head. Channel pairs
    ``(j, j + d/2)``.

    The same encoding as RoPE-ViT's RoPE-Mixed and timm's ``RotaryEmbeddingMixed``: with
    one seed the initial ``freqs`` are the same numbers (timm's ``init_random_2d_freqs``
    draws the same), and the rotations are equal up to the pair layout (timm interleaves
    the pairs as ``(2j, 2j + 1)``; see :class:`AxialRoPE2d`).

    Args:
        depth: layers.
        num_heads: heads.
        head_dim: channels per head (multiple of 4).
        theta: magnitude base. Default: 10 (RoPE-ViT's mixed setting).

    Parameters:
        freqs: ``(2, depth, heads, head_dim/2)``: ``freqs[0]`` = ``fx``, ``freqs[1]`` = ``fy``.
            Keep it out of weight decay (as RoPE-ViT does).
    """

    name = 'rope2d_mixed'
    options = ('theta',)

    def __init__(self, depth: int, num_heads: int, head_dim: int, theta: float = 10.0):
        super().__init__()
        if head_dim % 4:
            raise ValueError(
                f"pos_encoding='rope2d_mixed' needs head channels divisible by 4 "
                f'(embed_dims / num_heads), got {head_dim}'
            )
        self.depth, self.num_heads, self.head_dim = depth, num_heads, head_dim
        self.theta = check_number('pos_encoding theta', theta, 0, strict=True)
        self.freqs = nn.Parameter(torch.zeros(2, depth, num_heads, head_dim // 2))
        self.reset_parameters()

    @classmethod
    def from_spec(cls, options: Mapping[str, Any], trunk: Trunk, **spec: Any) -> 'MixedRoPE2d':
        return cls(trunk.depth, trunk.num_heads, trunk.head_dim, **options)

    @torch.no_grad()
    def reset_parameters(self) -> None:
        mag = self.theta ** (
            -torch.arange(0, self.head_dim, 4, dtype=torch.float32) / self.head_dim
        )  # (d/4,)
        phi = torch.rand(self.depth, self.num_heads, 1, device=self.freqs.device) * 2 * math.pi
        mag = mag.to(self.freqs.device)
        fx = torch.cat([mag * torch.cos(phi), mag * torch.cos(phi + math.pi / 2)], dim=-1)
        fy = torch.cat([mag * torch.sin(phi), mag * torch.sin(phi + math.pi / 2)], dim=-1)
        self.freqs.copy_(torch.stack([fx, fy]))

    def angles(self, layer: int, grid_size: Tuple[int, int], device: torch.device) -> Tensor:
        ys, xs = patch_coordinates(grid_size, device)
        fx, fy = self.freqs[0, layer].float(), self.freqs[1, layer].float()  # (heads, d/2)
        return xs[None, :, None] * fx[:, None, :] + ys[None, :, None] * fy[:, None, :]

    def extra_repr(self) -> str:
        return (
            f'name={self.name!r}, depth={self.depth}, num_heads={self.num_heads}, '
            f'head_dim={self.head_dim}, theta={self.theta}'
        )
