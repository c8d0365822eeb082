"""The interface every position encoding of the trunk implements, and content-only attention.

See the package docstring (:mod:`lookhere_dense.lookhere.pos_encoding`) for the interface.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Optional, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from ..attention.windows import attend_in_windows, padded_grid, sdpa_in_windows, window_key_mask
from ..config import LookHereConfig
from ..prefix_tokens import check_tokens, num_prefix_tokens

__all__ = ['PositionEncoding', 'NoPositionEncoding', 'Trunk', 'window_sdpa', 'isolated_rng']


@dataclass(eq=False)
class Trunk:
    """What an encoding is built for: the trunk's sizes and the LookHere engine's settings
    (the factory, :func:`~.factory.build_position_encoding`, hands it to
    :meth:`PositionEncoding.from_spec`).

    Attributes:
        embed_dims, num_heads, depth: the trunk's sizes.
        grid_size: the training grid ``(H, W)`` (used by ``abs``).
        interpolate_mode: ``abs`` resampling mode. Default: ``'bicubic'``.
        attn_backend: the LookHere engine's backend. Default: ``'auto'``.
        attn_block_size: query rows per block of the chunked backend. Default: None.
        max_dense_bias_mb: the LookHere engine's dense-bias budget. Default: 1024.
        engine: an existing LookHere engine for ``lookhere`` / ``alibi2d`` (None builds one
            from the settings above). Default: None.
    """

    embed_dims: int
    num_heads: int
    depth: int
    grid_size: Tuple[int, int]
    interpolate_mode: str = 'bicubic'
    attn_backend: str = 'auto'
    attn_block_size: Optional[int] = None
    max_dense_bias_mb: float = 1024
    engine: Any = None

    @property
    def head_dim(self) -> int:
        """Channels per head."""
        return self.embed_dims // self.num_heads


@contextlib.contextmanager
def isolated_rng(device: Union[torch.device, str, None] = None) -> Iterator[None]:
    """Run a block with the global RNG (CPU, and ``device``'s if it is CUDA) restored after it.

    Random initialisation of an encoding's own parameters happens inside this, so the trunk's
    initialisation draws the same numbers whatever the encoding: with one seed, models that
    differ only in ``pos_encoding`` start from identical blocks, patch embedding and heads.
    """
    device = torch.device(device) if device is not None else torch.device('cpu')
    devices = [device] if device.type == 'cuda' else []
    with torch.random.fork_rng(devices=devices):
        yield


def window_sdpa(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    grid_size: Tuple[int, int],
    window_size: int,
    cls_token: Union[bool, int],
    dropout_p: float = 0.0,
) -> Tensor:
    """ViTDet window attention without a position bias.

    Patches attend within their ``window_size`` x ``window_size`` window (padded keys of
    border windows are masked). ``cls_token``: number ``J`` of global prefix tokens at the
    front (CLS, or Jumbo tokens; True = 1): every window also sees the prefix keys and
    the prefix queries attend to all tokens, as in
    :meth:`~lookhere_dense.lookhere.LookHereAttentionEngine.window_attention`.

    Args:
        q, k, v: ``(B, heads, T, d)`` with ``T = J + H*W`` for ``grid_size = (H, W)``.

    Returns:
        ``(B, heads, T, d)``.
    """
    ws = int(window_size)
    mask = None
    if padded_grid(grid_size, ws) != tuple(grid_size):
        mask = window_key_mask(grid_size, ws, cls_token, q.device, q.dtype)

    def attend(qw: Tensor, kw: Tensor, vw: Tensor) -> Tensor:
        return sdpa_in_windows(qw, kw, vw, None, mask, dropout_p)

    return attend_in_windows(q, k, v, grid_size, ws, cls_token, attend, dropout_p)


class PositionEncoding(nn.Module):
    """Common interface of the position encodings (see the module docstring).

    The default implementation is content-only attention: subclasses that only transform
    queries and keys (RoPE) override :meth:`rotate`; ``abs`` overrides
    :meth:`add_to_tokens`; bias-based encodings override :meth:`forward` and
    :meth:`window_attention`.
    """

    #: the ``pos_encoding`` name this class implements
    name: str = ''
    #: the options of the dict form ``dict(type=NAME, **options)``: keyword arguments of
    #: the constructor a config may set (the rest come from the trunk)
    options: Tuple[str, ...] = ()
    #: whether :meth:`forward` / :meth:`window_attention` need ``tokens`` (the attention's
    #: input); the attention passes them only to encodings that say so
    uses_tokens: bool = False

    @classmethod
    def from_spec(
        cls, options: Mapping[str, Any], trunk: Trunk, **spec: Any
    ) -> 'PositionEncoding':
        """Build for ``trunk`` with the spec's ``options`` (the factory's call). The default
        takes no trunk sizes: ``cls(**options)``; ``spec`` holds the rest of the parsed spec
        (``name``, ``lh_config``) for the encodings that need it."""
        return cls(**options)

    def set_train_grid(self, grid_size: Tuple[int, int]) -> None:
        """Make ``grid_size`` the training grid (the trunk's ``set_input_size``). The
        default keeps nothing of the grid, so nothing changes; ``abs`` resamples its
        table."""

    def add_to_tokens(self, x: Tensor, grid_size: Tuple[int, int]) -> Tensor:
        """Patch tokens ``(B, H*W, D)`` (no prefix tokens) -> the tokens the blocks get
        (same shape)."""
        return x

    def rotate(
        self,
        q: Tensor,
        k: Tensor,
        layer: int,
        grid_size: Tuple[int, int],
        cls_token: Union[bool, int],
    ) -> Tuple[Tensor, Tensor]:
        """Queries and keys ``(B, heads, T, d)`` as the attention logits should see them
        (``T = J + H*W``; ``cls_token``: the number ``J`` of global prefix tokens at the
        front, CLS or Jumbo tokens, True = 1, which carry no position)."""
        return q, k

    def forward(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        layer: int,
        grid_size: Tuple[int, int],
        cls_token: Union[bool, int],
        dropout_p: float = 0.0,
        tokens: Optional[Tensor] = None,
    ) -> Tensor:
        """Global attention of ``layer``: ``(B, heads, T, d)`` -> ``(B, heads, T, d)``,
        ``T = J + H*W`` with ``J = cls_token`` global prefix tokens at the front (CLS, or
        Jumbo tokens; True = 1). ``tokens``: the attention's input ``(B, T, C)``,
        used by encodings with :attr:`uses_tokens` (ignored here). Default: None."""
        off = num_prefix_tokens(cls_token)
        check_tokens('attention', q.shape[-2], grid_size, off, k.shape[-2])
        q, k = self.rotate(q, k, layer, grid_size, cls_token)
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p)

    def window_attention(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        layer: int,
        grid_size: Tuple[int, int],
        window_size: int,
        cls_token: Union[bool, int],
        dropout_p: float = 0.0,
        tokens: Optional[Tensor] = None,
    ) -> Tensor:
        """ViTDet window attention of ``layer`` (see :func:`window_sdpa`); shapes and
        ``tokens`` as :meth:`forward`."""
        q, k = self.rotate(q, k, layer, grid_size, cls_token)
        return window_sdpa(q, k, v, grid_size, window_size, cls_token, dropout_p)

    @property
    def lh_config(self) -> Optional[LookHereConfig]:
        """The LookHere config of the encoding's bias; None (the default) for encodings
        without a LookHere bias."""
        return None

    def reset_parameters(self) -> None:
        """(Re-)initialise the encoding's own parameters (none by default)."""

    def clear_caches(self) -> None:
        """Drop every cached tensor (bias tables, rotation angles), so the next forward
        starts from a clean slate (e.g. for a memory measurement). Nothing by default."""

    def extra_repr(self) -> str:
        return f'name={self.name!r}'


class NoPositionEncoding(PositionEncoding):
    """``'none'``: attention over content only (permutation-equivariant over patches)."""

    name = 'none'
