"""``pos_encoding='pape'``: Parabolic Position Encoding (PaPE) in plain PyTorch.

Øhrstrøm et al., "Where to Attend: A Principled Vision-Centric Position Encoding with
Parabolas", arXiv 2602.01418, 2026 (reference code: DTU-PAS/parabolic-position-encoding,
``pape/nn/positions/pape.py``). Written from the definition below, not copied.

Definition. In layer ``l`` and head ``h`` with ``P`` parabolas, patch ``i`` at column /
row ``(x_i, y_i)`` has the parabola coordinates ``p_i = W_pos[l, h] (x_i, y_i)`` (``P``
learned directions and scales; a linear map without bias) and, from its token ``t_i``
(the attention's input, after the block's norm), the curvatures
``a_i = softplus(W_a[l, h] t_i) > 0`` and slopes ``s_i = W_s[l, h] t_i``. The attention
logit of query ``i`` and key ``j`` gains::

    pape(i, j) = sum_m  -a_im (p_im - p_jm)^2 + s_im (p_im - p_jm)

before the ``1/sqrt(head_dim)`` scale, as in the reference:
``softmax_j((q_i . k_j + pape(i, j)) / sqrt(d))``. Each term is a downward parabola in
the offset along one learned direction, its width and tilt set by the query's content;
it depends on positions only through ``p_i - p_j`` (translation invariant), so larger
grids use larger offsets, like RoPE and LookHere.

Fast path (no ``N x N`` bias, so the fused SDPA kernel runs): expanding the square,
``pape(i, j) = c_i * 1 + a_i . (-p_j^2) + (2 a_i p_i - s_i) . p_j`` with
``c_i = sum_m (s_im - a_im p_im) p_im``, so each head's query gains the ``2P + 1``
features ``[c_i, a_i, 2 a_i p_i - s_i]`` and its key ``[1, -p_j^2, p_j]``
(:func:`parabola_features`; the reference appends ``3P + 2`` features with the same dot
products), zero-padded so that ``head_dim`` plus the features is a multiple of 8 (as
the reference, for the kernels). The ``1/sqrt(head_dim)`` scale is folded into the
extended query, so any SDPA call with its default scale (window frames included) is
right. The values are zero-padded to the same width and the output sliced back: SDPA's
flash kernels need one head size for q, k and v (without the padding, CPU falls back to
the math kernel, which materialises ``N x N``; measured 1.4-1.9x slower at 197-2305
tokens).

Conventions of this toolkit (the reference differs; no logit of a patch pair changes):

* the global prefix tokens (CLS, or Jumbo tokens) have no position: their appended
  features are zero on both sides, so ``pape`` is 0 to and from them (the reference puts
  CLS at the origin of the grid);
* coordinates are centred on the grid (``pape`` only sees offsets; centring halves the
  features' magnitudes, which helps half precision, where the expanded square loses
  digits on large grids -- prefer float32 attention for large-grid evaluation);
* initialisation as the reference (PyTorch's ``nn.Linear`` default,
  ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))``), run under
  :func:`~lookhere_dense.lookhere.pos_encoding.isolated_rng` by the backbone; weight decay
  applies to both weights, as in the reference (which decays every parameter).
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, Callable, Mapping, Optional, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from lookhere_dense.validation import check_int

from ..cache import BoundedCache
from ..prefix_tokens import check_tokens, num_prefix_tokens
from .base import PositionEncoding, Trunk, window_sdpa

__all__ = ['ParabolicPositionEncoding', 'parabola_features']


def parabola_features(
    positions: Tensor, curvature: Tensor, slope: Tensor
) -> Tuple[Tensor, Tensor]:
    """The features PaPE appends to queries and keys.

    Args:
        positions: parabola coordinates ``p``, ``(..., N, P)`` (broadcastable against the
            other two).
        curvature: ``a``, ``(..., N, P)``.
        slope: ``s``, ``(..., N, P)``.

    Returns:
        ``(query_features, key_features)``, ``(..., N, 2P + 1)`` each (the key features
        with the leading dims of ``positions``), such that
        ``query_features[i] . key_features[j] = sum_m -a_im (p_im - p_jm)^2
        + s_im (p_im - p_jm)``.
    """
    const = ((slope - curvature * positions) * positions).sum(-1, keepdim=True)
    query = torch.cat([const, curvature, 2 * curvature * positions - slope], dim=-1)
    key = torch.cat([torch.ones_like(positions[..., :1]), -positions.square(), positions], dim=-1)
    return query, key


def _full_precision(device: torch.device):
    """A context computing the features in the inputs' dtype even under autocast."""
    if device.type in ('cuda', 'cpu'):
        return torch.autocast(device_type=device.type, enabled=False)
    return contextlib.nullcontext()


class ParabolicPositionEncoding(PositionEncoding):
    """``'pape'``: Parabolic Position Encoding (see the module docstring for the math).

    Args:
        embed_dims: token channels ``C`` (the input of the curvature / slope map).
        depth: layers.
        num_heads: heads.
        parabolas: parabolas ``P`` per head and layer. Default: 50 (the reference).

    Parameters:
        position_proj: ``(depth, heads * P, 2)``: row ``h * P + m`` maps ``(x, y)`` to the
            coordinate of parabola ``m`` of head ``h``.
        curve_proj: ``(depth, 2 * heads * P, C)``: rows ``h * P + m`` give the curvature
            (before softplus), rows ``heads * P + h * P + m`` the slope.
    """

    name = 'pape'
    options = ('parabolas',)
    uses_tokens = True

    @classmethod
    def from_spec(
        cls, options: Mapping[str, Any], trunk: Trunk, **spec: Any
    ) -> 'ParabolicPositionEncoding':
        return cls(trunk.embed_dims, trunk.depth, trunk.num_heads, **options)

    def __init__(self, embed_dims: int, depth: int, num_heads: int, parabolas: int = 50):
        super().__init__()
        check_int("pos_encoding='pape': parabolas", parabolas)
        if embed_dims % num_heads:
            raise ValueError(f'embed_dims={embed_dims} is not divisible by num_heads={num_heads}')
        self.embed_dims, self.depth, self.num_heads = embed_dims, depth, num_heads
        self.head_dim = embed_dims // num_heads
        self.parabolas = parabolas
        hp = num_heads * parabolas
        self.position_proj = nn.Parameter(torch.empty(depth, hp, 2))
        self.curve_proj = nn.Parameter(torch.empty(depth, 2 * hp, embed_dims))
        self._coords = BoundedCache(8)
        self.reset_parameters()

    @property
    def num_features(self) -> int:
        """Channels appended to each head's queries and keys: ``2P + 1``, padded so that
        ``head_dim + num_features`` is a multiple of 8."""
        total = self.head_dim + 2 * self.parabolas + 1
        return 8 * math.ceil(total / 8) - self.head_dim

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """The reference's init: ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))`` (``nn.Linear``)."""
        self.position_proj.uniform_(-1 / math.sqrt(2), 1 / math.sqrt(2))
        bound = 1 / math.sqrt(self.embed_dims)
        self.curve_proj.uniform_(-bound, bound)

    def patch_coordinates(
        self, grid_size: Tuple[int, int], device: Union[torch.device, str, None] = None
    ) -> Tensor:
        """``(H*W, 2)`` float32 ``(x, y)`` (column, row) of every patch, row-major,
        centred on the grid."""
        grid = (int(grid_size[0]), int(grid_size[1]))

        def make() -> Tensor:
            ys, xs = torch.meshgrid(
                torch.arange(grid[0], dtype=torch.float32, device=device),
                torch.arange(grid[1], dtype=torch.float32, device=device),
                indexing='ij',
            )
            return torch.stack(
                [xs.flatten() - (grid[1] - 1) / 2, ys.flatten() - (grid[0] - 1) / 2], dim=-1
            )

        return self._coords.get_or_create((grid, str(device)), make)

    def parabola_coordinates(
        self,
        layer: int,
        grid_size: Tuple[int, int],
        device: Union[torch.device, str, None] = None,
        dtype: torch.dtype = torch.float32,
    ) -> Tensor:
        """``p`` of ``layer``: ``(heads, H*W, P)``."""
        xy = self.patch_coordinates(grid_size, device).to(dtype)
        p = xy @ self.position_proj[layer].to(dtype).t()  # (N, heads * P)
        return p.view(-1, self.num_heads, self.parabolas).transpose(0, 1)

    def curvature_and_slope(
        self, tokens: Tensor, layer: int, dtype: torch.dtype = torch.float32
    ) -> Tuple[Tensor, Tensor]:
        """``a`` and ``s`` of ``layer`` from patch tokens ``(B, N, C)``: ``(B, heads, N, P)``
        each."""
        b, n, _ = tokens.shape
        out = tokens.to(dtype) @ self.curve_proj[layer].to(dtype).t()  # (B, N, 2*heads*P)
        out = out.view(b, n, 2, self.num_heads, self.parabolas).permute(2, 0, 3, 1, 4)
        return F.softplus(out[0]), out[1]

    def extend(
        self,
        q: Tensor,
        k: Tensor,
        tokens: Optional[Tensor],
        layer: int,
        grid_size: Tuple[int, int],
        cls_token: Union[bool, int],
    ) -> Tuple[Tensor, Tensor]:
        """Queries and keys with the PaPE features appended, the scale folded into the
        queries: ``(B, heads, T, d)`` -> ``(B, heads, T, d + num_features)``, so that
        ``SDPA(q', k', v)`` (default scale) is PaPE attention.

        Raises:
            ValueError: no ``tokens``, or shapes that do not fit the grid / this encoding.
        """
        if tokens is None:
            raise ValueError(
                "pos_encoding='pape' needs the attention's input tokens "
                '(tokens=, shape (B, T, C)): its curvatures and slopes come '
                'from the token content'
            )
        off = num_prefix_tokens(cls_token)
        b, heads, t, d = q.shape
        check_tokens('attention', t, grid_size, off, k.shape[-2])
        if heads != self.num_heads or d != self.head_dim:
            raise ValueError(
                f"pos_encoding='pape' was built for {self.num_heads} heads of "
                f'{self.head_dim} channels, got {heads} x {d}'
            )
        if tokens.shape != (b, t, self.embed_dims):
            raise ValueError(
                f"pos_encoding='pape' needs tokens of shape "
                f'{(b, t, self.embed_dims)}, got {tuple(tokens.shape)}'
            )
        if not 0 <= layer < self.depth:
            raise ValueError(f"pos_encoding='pape' has {self.depth} layers, got layer {layer}")
        dtype = torch.promote_types(q.dtype, torch.float32)
        with _full_precision(q.device):
            p = self.parabola_coordinates(layer, grid_size, q.device, dtype)[None]
            a, s = self.curvature_and_slope(tokens[:, off:], layer, dtype)
            qf, kf = parabola_features(p, a, s)
        pad = (0, self.num_features - qf.shape[-1], off, 0)  # feature padding, prefix rows: 0
        # cast to q's dtype before padding: under autocast the padded copies are bfloat16
        qf, kf = F.pad(qf.to(q.dtype), pad), F.pad(kf.to(k.dtype), pad).expand(b, -1, -1, -1)
        scale = math.sqrt((d + self.num_features) / d)
        return torch.cat([q, qf], dim=-1) * scale, torch.cat([k, kf], dim=-1)

    def _attend_extended(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        tokens: Optional[Tensor],
        layer: int,
        grid_size: Tuple[int, int],
        cls_token: Union[bool, int],
        attend: Callable[[Tensor, Tensor, Tensor], Tensor],
    ) -> Tensor:
        """PaPE attention through ``attend`` (SDPA, or window SDPA): ``q, k``
        :meth:`extend`-ed, ``v`` zero-padded to their head size (one head size for the
        flash kernels), the output cut back to ``v``'s ``d`` channels: ``(B, heads, T, d)``."""
        d = v.shape[-1]
        q, k = self.extend(q, k, tokens, layer, grid_size, cls_token)
        return attend(q, k, F.pad(v, (0, q.shape[-1] - d)))[..., :d]

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
        def attend(*qkv: Tensor) -> Tensor:
            return F.scaled_dot_product_attention(*qkv, dropout_p=dropout_p)

        return self._attend_extended(q, k, v, tokens, layer, grid_size, cls_token, attend)

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
        def attend(*qkv: Tensor) -> Tensor:
            return window_sdpa(*qkv, grid_size, window_size, cls_token, dropout_p)

        return self._attend_extended(q, k, v, tokens, layer, grid_size, cls_token, attend)

    def clear_caches(self) -> None:
        """Drop the cached patch coordinates."""
        self._coords.clear()

    def extra_repr(self) -> str:
        return (
            f'name={self.name!r}, embed_dims={self.embed_dims}, depth={self.depth}, '
            f'num_heads={self.num_heads}, parabolas={self.parabolas}, '
            f'num_features={self.num_features}'
        )
