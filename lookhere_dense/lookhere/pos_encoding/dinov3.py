"""``'rope_dinov3'``: DINOv3's axial RoPE through timm's ``RotaryEmbeddingDinoV3`` (timm is
imported when the encoding is built, so the rest of the package needs no timm)."""

from __future__ import annotations

from typing import Any, Mapping, Optional, Tuple, Union

import torch
from torch import Tensor

from lookhere_dense.validation import check_number

from ..cache import BoundedCache
from .base import PositionEncoding, Trunk
from .rope import rotate_patch_tokens

__all__ = ['DinoV3RoPE2d']


def _timm_dinov3_rope() -> Tuple[Any, Any]:
    """timm's ``RotaryEmbeddingDinoV3`` and ``apply_rot_embed_cat`` (imported on use)."""
    try:
        from timm.layers.pos_embed_sincos import RotaryEmbeddingDinoV3, apply_rot_embed_cat
    except ImportError as err:
        raise ImportError(
            "pos_encoding='rope_dinov3' uses timm's RotaryEmbeddingDinoV3 "
            '(timm >= 1.0.20: `pip install -U timm`), which could not be '
            f'imported: {err}'
        ) from err
    return RotaryEmbeddingDinoV3, apply_rot_embed_cat


class DinoV3RoPE2d(PositionEncoding):
    """``'rope_dinov3'``: DINOv3's axial RoPE (Simeoni et al. 2025), timm's implementation.

    Wraps ``timm.layers.pos_embed_sincos.RotaryEmbeddingDinoV3`` (numerically DINOv3's
    ``RopePositionEmbedding``): patch centres ``((i + 0.5) / n) * 2 - 1`` per axis, in
    ``[-1, 1]`` whatever the grid (a larger test grid is denser, not larger); periods
    ``theta ** (2i / (d/2))`` for ``i < d/4``; angles ``2 pi * coordinate / period``, the
    first ``d/4`` channel pairs with the row, the next ``d/4`` with the column; pairs
    ``(j, j + d/2)`` (timm's ``rotate_half=True``, DINOv3's layout). No parameters.

    While training (``self.training``) the coordinates get DINOv3's augmentations, one
    random transform per forward shared by every layer: a shift uniform in
    ``[-shift, shift]`` per axis, a per-axis scale log-uniform in ``[1/jitter, jitter]``,
    a shared scale log-uniform in ``[1/rescale, rescale]`` (timm's order and RNG use). It
    is drawn in :meth:`add_to_tokens`, which the backbone calls once per forward (without
    that call, :meth:`rotate` draws once per new grid). Evaluation uses the plain
    coordinates.

    Args:
        head_dim: channels per head (multiple of 4).
        theta: period base (timm's ``temperature``, DINOv3's ``pos_embed_rope_base``).
            Default: 100 (DINOv3).
        normalize_coords: ``'separate'`` (each axis by its own length), ``'min'`` or
            ``'max'`` (both by the shorter / longer side). Default: ``'separate'`` (DINOv3).
        shift_coords: training shift, or None. Default: None (DINOv3).
        jitter_coords: training per-axis scale factor ``>= 1``, or None. Default: None
            (DINOv3).
        rescale_coords: training shared scale factor ``>= 1``, or None. Default: 2
            (DINOv3's released models).

    Raises:
        ImportError: timm (with ``RotaryEmbeddingDinoV3``) is not installed.
        ValueError: a head size not divisible by 4, or a bad option.
    """

    name = 'rope_dinov3'
    options = ('theta', 'normalize_coords', 'shift_coords', 'jitter_coords', 'rescale_coords')

    def __init__(
        self,
        head_dim: int,
        theta: float = 100.0,
        normalize_coords: str = 'separate',
        shift_coords: Optional[float] = None,
        jitter_coords: Optional[float] = None,
        rescale_coords: Optional[float] = 2.0,
    ):
        super().__init__()
        if head_dim % 4:
            raise ValueError(
                f"pos_encoding='rope_dinov3' needs head channels divisible by 4 "
                f'(embed_dims / num_heads), got {head_dim}'
            )
        if normalize_coords not in ('separate', 'min', 'max'):
            raise ValueError(
                f"pos_encoding='rope_dinov3': normalize_coords must be "
                f"'separate', 'min' or 'max', got {normalize_coords!r}"
            )
        # checked here, not only by timm (timm < 1.0.2x took rescale_coords=0.5 silently)
        for name, value, low in (
            ('shift_coords', shift_coords, 0.0),
            ('jitter_coords', jitter_coords, 1.0),
            ('rescale_coords', rescale_coords, 1.0),
        ):
            if value is not None:
                check_number(f"pos_encoding='rope_dinov3': {name}", value, low)
        rope_cls, self._rotate_cat = _timm_dinov3_rope()
        try:
            #: timm's ``RotaryEmbeddingDinoV3`` (its ``periods`` buffer is not saved)
            self.rope = rope_cls(
                dim=head_dim,
                temperature=check_number('pos_encoding theta', theta, 0, strict=True),
                normalize_coords=normalize_coords,
                grid_indexing='ij',
                rotate_half=True,
                shift_coords=shift_coords,
                jitter_coords=jitter_coords,
                rescale_coords=rescale_coords,
            )
        except (TypeError, ValueError) as err:
            raise ValueError(f"pos_encoding='rope_dinov3': {err}") from None
        self.head_dim = head_dim
        self._cache = BoundedCache(8)
        self._drawn: Optional[Tuple[Tuple[int, int], Tensor]] = None

    @classmethod
    def from_spec(cls, options: Mapping[str, Any], trunk: Trunk, **spec: Any) -> 'DinoV3RoPE2d':
        return cls(trunk.head_dim, **options)

    @property
    def augments(self) -> bool:
        """Whether forwards draw random coordinates now (training, some augmentation on)."""
        return self.training and self.rope.aug_active

    def draw(self, grid_size: Tuple[int, int]) -> Tensor:
        """Draw a random coordinate transform for ``grid_size``, keep it for the layers of
        this forward and return its embedding (see :meth:`embedding`)."""
        grid = (int(grid_size[0]), int(grid_size[1]))
        self._drawn = (grid, self.rope.get_embed(list(grid)))
        return self._drawn[1]

    def embedding(
        self, grid_size: Tuple[int, int], device: Union[torch.device, str, None] = None
    ) -> Tensor:
        """``(H*W, 2 * head_dim)``: ``[sin | cos]`` of the angles in timm's half layout
        (float32), row-major over the grid; while augmenting, this forward's drawn one."""
        grid = (int(grid_size[0]), int(grid_size[1]))
        if self.augments:
            drawn = self._drawn
            emb = drawn[1] if drawn is not None and drawn[0] == grid else self.draw(grid)
            return emb.to(device) if device is not None else emb
        return self._cache.get_or_create(
            (grid, str(device)), lambda: self.rope.get_embed(list(grid)).to(device)
        )

    def add_to_tokens(self, x: Tensor, grid_size: Tuple[int, int]) -> Tensor:
        """Tokens unchanged; while augmenting, draws this forward's coordinate transform."""
        if self.augments:
            self.draw(grid_size)
        else:
            self._drawn = None
        return x

    def rotate(
        self,
        q: Tensor,
        k: Tensor,
        layer: int,
        grid_size: Tuple[int, int],
        cls_token: Union[bool, int],
    ) -> Tuple[Tensor, Tensor]:
        # the [sin | cos] table in q's dtype (rounded to bfloat16 under autocast, |error|
        # <= 2^-9): rotating bf16 queries with the float32 table would promote q and k to
        # float32 copies of the frame (as rope2d's rotate_half_pairs does, for the same reason)
        emb = self.embedding(grid_size, q.device).to(q.dtype)
        return rotate_patch_tokens(
            q, k, grid_size, cls_token, lambda t: self._rotate_cat(t, emb, half=True)
        )

    def clear_caches(self) -> None:
        """Drop the cached embeddings and the drawn transform."""
        self._cache.clear()
        self._drawn = None

    def extra_repr(self) -> str:
        r = self.rope
        return (
            f'name={self.name!r}, head_dim={self.head_dim}, theta={r.temperature}, '
            f'normalize_coords={r.normalize_coords!r}, shift_coords={r.shift_coords}, '
            f'jitter_coords={r.jitter_coords}, rescale_coords={r.rescale_coords}'
        )
