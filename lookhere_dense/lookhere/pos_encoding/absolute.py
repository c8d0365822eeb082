"""``'abs'``: a learned absolute position embedding, resampled to the input's grid."""

from __future__ import annotations

import math
from typing import Any, Mapping, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from lookhere_dense.validation import check_number

from .base import PositionEncoding, Trunk

__all__ = ['AbsolutePositionEncoding', 'resample_abs_pos_embed']


def resample_abs_pos_embed(
    pos_embed: Tensor, src_grid: Tuple[int, int], dst_grid: Tuple[int, int], mode: str = 'bicubic'
) -> Tensor:
    """Resize a patch position embedding from one grid to another (mmseg / timm style).

    Args:
        pos_embed: ``(1, Hs*Ws, D)``, row-major over ``src_grid = (Hs, Ws)``.
        dst_grid: ``(Hd, Wd)``.
        mode: ``F.interpolate`` mode (``align_corners=False``). Default: ``'bicubic'``.

    Returns:
        ``(1, Hd*Wd, D)`` (the input itself when the grids are equal).
    """
    src_grid, dst_grid = tuple(src_grid), tuple(dst_grid)
    if pos_embed.dim() != 3 or pos_embed.shape[1] != src_grid[0] * src_grid[1]:
        raise ValueError(
            f'pos_embed of shape {tuple(pos_embed.shape)} is not (1, H*W, D) for '
            f'the grid {src_grid}'
        )
    if src_grid == dst_grid:
        return pos_embed
    dim = pos_embed.shape[-1]
    grid = pos_embed.reshape(1, src_grid[0], src_grid[1], dim).permute(0, 3, 1, 2)
    kwargs = {} if mode in ('nearest', 'area') else dict(align_corners=False)
    grid = F.interpolate(grid.float(), size=dst_grid, mode=mode, **kwargs).to(pos_embed.dtype)
    return grid.permute(0, 2, 3, 1).reshape(1, dst_grid[0] * dst_grid[1], dim)


class AbsolutePositionEncoding(PositionEncoding):
    """``'abs'``: a learned embedding per patch of the training grid, added to the tokens.

    Inputs whose grid differs are given the embedding resampled to their grid with
    :func:`resample_abs_pos_embed`. The global prefix tokens (CLS, or Jumbo tokens) get no
    embedding (as DeiT-III, the trunk's architecture); a timm checkpoint whose
    ``pos_embed`` has a CLS entry has that entry folded into ``cls_token`` on loading (an
    exact conversion, see :meth:`adapt_checkpoint_embedding`).

    Args:
        embed_dims: token channels ``D``.
        grid_size: ``(H, W)`` patch grid of the training size (``img_size / patch_size``).
        interpolate_mode: resampling mode. Default: ``'bicubic'``.
        init_std: std of the truncated-normal init (timm). Default: 0.02.

    Parameters:
        pos_embed: ``(1, H*W, D)``.
    """

    name = 'abs'
    options = ('init_std',)

    def __init__(
        self,
        embed_dims: int,
        grid_size: Tuple[int, int],
        interpolate_mode: str = 'bicubic',
        init_std: float = 0.02,
    ):
        super().__init__()
        if len(grid_size) != 2 or min(grid_size) < 1:
            raise ValueError(f'grid_size must be (H, W) >= 1, got {grid_size!r}')
        self.grid_size = (int(grid_size[0]), int(grid_size[1]))
        self.interpolate_mode = interpolate_mode
        self.init_std = check_number('pos_encoding init_std', init_std, 0)
        self.pos_embed = nn.Parameter(
            torch.zeros(1, self.grid_size[0] * self.grid_size[1], embed_dims)
        )
        self.reset_parameters()

    @classmethod
    def from_spec(
        cls, options: Mapping[str, Any], trunk: Trunk, **spec: Any
    ) -> 'AbsolutePositionEncoding':
        return cls(trunk.embed_dims, trunk.grid_size, trunk.interpolate_mode, **options)

    def reset_parameters(self) -> None:
        nn.init.trunc_normal_(self.pos_embed, std=self.init_std, a=-2.0, b=2.0)

    def embedding(self, grid_size: Tuple[int, int]) -> Tensor:
        """The embedding for ``grid_size``: ``(1, H*W, D)``."""
        return resample_abs_pos_embed(
            self.pos_embed, self.grid_size, tuple(grid_size), self.interpolate_mode
        )

    def set_train_grid(self, grid_size: Tuple[int, int]) -> None:
        """Resample the table to ``grid_size`` (``interpolate_mode``), which becomes its
        own grid (as timm's ``VisionTransformer.set_input_size``). The parameter stays the
        same object, its data resized (frozen or trainable as it was): an optimizer built
        before holds it still -- mmengine's Runner builds the optimizer before ``load_from``
        / ``--resume`` loads a file whose recorded training size calls this; a new
        parameter there was never updated. Its gradient is dropped (another shape). Not
        under DDP, which mmengine wraps before loading too: its gradient hooks keep the
        old shape and the first backward fails, so build the model at the file's training
        size (``img_size``) for a multi-process run."""
        grid = (int(grid_size[0]), int(grid_size[1]))
        if grid == self.grid_size:
            return
        table = self.embedding(grid).detach().clone()
        self.pos_embed.data = table
        self.pos_embed.grad = None
        self.grid_size = grid

    def add_to_tokens(self, x: Tensor, grid_size: Tuple[int, int]) -> Tensor:
        return x + self.embedding(grid_size).to(x.dtype)

    def adapt_checkpoint_embedding(
        self, pos_embed: Tensor, has_cls: Optional[bool] = None
    ) -> Tuple[Tensor, Optional[Tensor], str]:
        """A checkpoint's ``pos_embed`` resampled to this encoding's shape.

        Accepts ``(1, N, D)`` with ``N = h*w`` (DeiT-III / ours) or ``N = 1 + h*w`` (timm
        ViTs with a CLS entry, returned separately). ``(h, w)`` is this encoding's grid when
        ``N`` or ``N - 1`` matches it (tested first: a non-square grid with a CLS entry can
        have a square length), else the square ``sqrt(N)`` / ``sqrt(N - 1)`` grid.
        ``has_cls`` settles it where the file tells: False for our own ``pos_enc.pos_embed``
        (never a CLS entry: a 7x7 table into a 6x8 model is resampled, not read as 6x8 +
        CLS), True for a table known to have one. Default: None (guessed as above).

        Returns:
            ``(patches, cls_entry, note)``: the ``(1, H*W, D)`` patch embedding, the
            ``(1, 1, D)`` CLS entry or None (add it to ``cls_token`` for the same CLS input
            as in the checkpoint's model), and what was done.

        Raises:
            ValueError: wrong channel count, or a length that is no grid.
        """
        if pos_embed.dim() == 2:
            pos_embed = pos_embed[None]
        if pos_embed.dim() != 3 or pos_embed.shape[0] != 1:
            raise ValueError(
                f'checkpoint pos_embed has shape {tuple(pos_embed.shape)}, expected (1, N, D)'
            )
        dim = self.pos_embed.shape[-1]
        if pos_embed.shape[-1] != dim:
            raise ValueError(
                f'checkpoint pos_embed has {pos_embed.shape[-1]} channels, the '
                f'backbone {dim} (check embed_dims)'
            )
        own = self.grid_size[0] * self.grid_size[1]
        notes = []

        def square(n: int) -> Optional[Tuple[int, int]]:
            side = math.isqrt(n)
            return (side, side) if side * side == n and n > 0 else None

        n = pos_embed.shape[1]
        cls_entry = None
        # this grid exactly (with or without a CLS entry) before any square-grid guess: a
        # non-square h x w grid with CLS (e.g. 6x8 + 1 = 49) would else be read as a 7x7
        plain = has_cls is not True  # N = h*w may be read
        with_cls = has_cls is not False  # N = 1 + h*w may be read
        if plain and n == own:
            src = self.grid_size
        elif with_cls and n - 1 == own:
            src = self.grid_size
            cls_entry = pos_embed[:, :1]
        elif plain and square(n):
            src = square(n)
        elif with_cls and square(n - 1):
            src = square(n - 1)
            cls_entry = pos_embed[:, :1]
        else:
            raise ValueError(
                f"checkpoint pos_embed has {n} tokens: neither this backbone's "
                f'{self.grid_size[0]}x{self.grid_size[1]} grid nor a square grid '
                '(with or without a CLS entry)'
            )
        if cls_entry is not None:
            pos_embed = pos_embed[:, 1:]
            notes.append('split off its CLS entry')
        if tuple(src) != self.grid_size:
            notes.append(
                f'resampled {src[0]}x{src[1]} -> '
                f'{self.grid_size[0]}x{self.grid_size[1]} ({self.interpolate_mode})'
            )
        out = resample_abs_pos_embed(pos_embed, tuple(src), self.grid_size, self.interpolate_mode)
        return out, cls_entry, '; '.join(notes) or 'kept as is'

    def extra_repr(self) -> str:
        return (
            f'name={self.name!r}, grid_size={self.grid_size}, '
            f'interpolate_mode={self.interpolate_mode!r}'
        )
